"""Plain references of every attention kernel in hf_mgk, written from the papers' equations.

Each is the formula computed the obvious way (every pair, every key, O(N^2) memory or more: small inputs only), in
torch alone. They import nothing from the fast kernels and nothing imports them there, so a bug in a kernel cannot
hide in its reference; the tests hold every named backend of every kernel to these outputs and gradients. This
package does not travel with checkpoints.
"""

from .fish import fish_attention_reference
from .mgk import mgk_attention_reference, mlk_attention_reference, smgk_attention_reference
from .nprf import nprf_attention_reference

__all__ = [
    "fish_attention_reference",
    "mgk_attention_reference",
    "mlk_attention_reference",
    "nprf_attention_reference",
    "smgk_attention_reference",
]
