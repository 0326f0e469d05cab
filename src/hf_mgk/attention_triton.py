"""What the Triton kernels of every family share: the guarded import, where they can run, products with float32
accumulation, and the counter-based dropout mask.

The kernels follow the flash pattern of Dao et al., "FlashAttention: Fast and Memory-Efficient Exact Attention with
IO-Awareness" (NeurIPS 2022), Alg. 1 and 2. Random numbers (dropout masks, FiSH's noise) are counter-based draws,
Philox keyed by one seed per call and by the element's position, so that the backward
kernels regenerate the forward's numbers with nothing stored and a seeded run repeats.

Torch, and Triton where it is installed (this file travels next to remote-code model files: the import is guarded,
and without Triton the other backends run). On CPU tensors the kernels run in Triton's interpreter when
TRITON_INTERPRET=1 was set before triton was imported.
"""

import logging
import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # no Triton: `available()` is False and the torch backends run
    triton = None
    tl = None

__all__ = ["LN2", "LOG2E", "MAX_COUNTER", "MAX_HEAD_SIZE", "MIN_CAPABILITY", "MIN_TRITON", "SEED_BOUND", "available",
           "capability", "capturing", "draw_seed", "env_switch", "fitted", "interpreting", "length_refusal",
           "platform_refusal",
           "precision", "refusal", "shape_class", "shared_memory", "switched_on", "tuned_blocks"]

logger = logging.getLogger(__name__)

# Head sizes (of q / k and of v) up to this are padded to a power of two >= 16 inside the kernels (masked loads).
MAX_HEAD_SIZE = 128
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
# The random draws (dropout masks, FiSH's noise) are keyed by 32-bit counters of the positions they cover: a call
# whose counters reach this is refused (they would wrap and repeat draws).
MAX_COUNTER = 2**31


SWITCH_VALUES = {"1": True, "true": True, "on": True, "yes": True, "0": False, "false": False, "off": False,
                 "no": False}


def env_switch(name, off_means):
    """The boolean environment switch `name`: 1 / true / on / yes or 0 / false / off / no, any case; unset or empty
    means on. Any other value is a ValueError naming the variable and what off means (`off_means`): a typo must not
    leave a switch on silently."""
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return True
    if value not in SWITCH_VALUES:
        raise ValueError(f"{name}={os.environ[name]!r} is not a switch: set it to 0 / false / off ({off_means}) or "
                         "1 / true / on")
    return SWITCH_VALUES[value]


def switched_on():
    """HF_MGK_TRITON, the switch that keeps every call on the torch paths when off (e.g. to compare with them or to
    rule the kernels out); on by default (`env_switch`)."""
    return env_switch("HF_MGK_TRITON", "the torch paths only")


# The oldest Triton the kernels compile with (the slow tests compile every kernel with it): with 3.2 the tuples they
# build in tl.static_range fail ("NameError: out is not defined"), with 3.3 the dropout mask's tl.join of the
# transposed draw (a layout its passes cannot infer).
MIN_TRITON = (3, 4)
# The oldest compute capability they run on: bfloat16 products on tensor cores (sm_75 / sm_70 compile them to plain
# FMAs) and up to 80 KB of shared memory a program (a T4 has 64 KB).
MIN_CAPABILITY = (8, 0)
_SAID = set()


def _version(text):
    """(major, minor) of a version string such as "3.3.1" or "3.4.0+git1234"."""
    parts = (text.split("+")[0].split(".") + ["0"])[:2]
    return tuple(int("".join(c for c in part if c.isdigit()) or 0) for part in parts)


def platform_refusal():
    """Why the kernels cannot run in this process, whatever the call (None: they can): Triton missing or older than
    MIN_TRITON, or a ROCm build of torch (its tensors say "cuda"; the kernels are built and checked for NVIDIA GPUs,
    and for AMD's gfx942 / gfx90a float32 FiSH's products and the noise's fast log do not compile)."""
    if triton is None:
        return "triton is not installed"
    if _version(getattr(triton, "__version__", "0")) < MIN_TRITON:
        return f"triton {triton.__version__} (the kernels need {'.'.join(map(str, MIN_TRITON))} or later)"
    if getattr(torch.version, "hip", None) and not interpreting():
        return "a ROCm build of torch (the kernels are built and checked for NVIDIA GPUs only)"
    return None


def available():
    """Whether the kernels can be used: HF_MGK_TRITON not switched off (`switched_on`) and nothing in this process
    refuses them (`platform_refusal`, said once at INFO)."""
    if not switched_on():
        return False
    why = platform_refusal()
    if why is not None and triton is not None and why not in _SAID:
        _SAID.add(why)
        logger.info("hf_mgk: the Triton kernels are not used: %s; the torch paths run", why)
    return why is None


# A grid's second axis takes at most 65,535 programs (CUDA's limit), and the kernels put the blocks of query rows
# (forward) or keys (backward) there, 16 rows or keys at the least: longer sequences are refused.
MAX_GRID_Y = 65535
MAX_LENGTH = MAX_GRID_Y * 16


def length_refusal(length):
    """Why a call whose longer sequence (N or S) has `length` positions cannot take the kernels (None: it can)."""
    if length > MAX_LENGTH:
        return (f"sequences this long ({length} positions: the kernels' grids take at most {MAX_GRID_Y} blocks "
                f"of rows or keys, so N and S up to {MAX_LENGTH})")
    return None


# Seeds of the kernels' draws stay below this: the dropout mask keys its Philox calls at 2^31 + batch x head, above
# every seed (attention_triton.keep).
SEED_BOUND = 2**31 - 2**20


def draw_seed(device, generator=None):
    """One seed for a call's draws (a dropout mask, FiSH's noise), from `generator`, else the default generator of
    `device` (a CUDA tensor's GPU, as the eager paths draw theirs; torch's CPU generator for CPU tensors), so a
    seeded run repeats whichever path `auto` chose. A CUDA generator's state is kept on the host (its seed and
    Philox offset): the seed is formed from them and the offset advanced as a draw of torch's own would, with no
    GPU work and no host sync. Not inside a CUDA graph's capture, where every replay would repeat the draws
    (`refusal` refuses the kernels there)."""
    if generator is None:
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            generator = torch.cuda.default_generators[index]
        else:
            generator = torch.default_generator
    if generator.device.type == "cuda" and hasattr(generator, "get_offset"):
        offset = generator.get_offset()
        generator.set_offset(offset + 4)  # Philox offsets advance in 4s (one 128-bit counter)
        mixed = (generator.initial_seed() * 0x9E3779B97F4A7C15 + offset * 0xBF58476D1CE4E5B9) % 2**64
        return (mixed >> 32) % SEED_BOUND
    return int(torch.randint(0, SEED_BOUND, (), generator=generator, device=generator.device))


def capturing(device_type):
    """Whether a CUDA graph is being captured on the current stream (never without a CUDA device)."""
    return device_type == "cuda" and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


_CAPABILITIES = {}


def capability(index=None):
    """The (major, minor) compute capability of CUDA device `index` (default: the current one), read once; None
    where torch sees no CUDA device (the rules' unit tests name "cuda" without one)."""
    if not torch.cuda.is_available():
        return None
    index = torch.cuda.current_device() if index is None else index
    if index not in _CAPABILITIES:
        _CAPABILITIES[index] = tuple(torch.cuda.get_device_capability(index))
    return _CAPABILITIES[index]


# Triton decides at import whether @triton.jit compiles or interprets: what the environment said then counts.
_INTERPRETED = triton is not None and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def interpreting():
    """Whether the kernels run in Triton's interpreter (CPU tensors): TRITON_INTERPRET=1 set before the import."""
    return _INTERPRETED


def refusal(device_type, head_size, *, installed=True, family=None, mask=None, tracing=False,
            dtype=torch.float32):
    """Why the kernels cannot run a call (None: they can): not `installed` (Triton missing or switched off); the
    family's own reason (`family`, None for none); a whole 4-D mask (`mask` "pairs"); `tracing` (an outer trace
    or compile); a dtype they do not take; the device; the head size (the larger of q / k's and v's)."""
    if not installed:
        return platform_refusal() or "HF_MGK_TRITON=0 switched the kernels off"
    if family is not None:
        return family
    if mask == "pairs":
        return "a whole 4-D mask"
    if tracing:
        return "tracing or compiling (an outer trace cannot see into the kernels)"
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"{dtype} (the kernels take float32, bfloat16 and float16)"
    if device_type == "cpu" and not interpreting():
        return "a CPU tensor outside Triton's interpreter (set TRITON_INTERPRET=1 before triton is imported)"
    if device_type not in ("cuda", "cpu"):
        return f"a {device_type} tensor (Triton runs on CUDA GPUs)"
    if capturing(device_type):
        return ("a CUDA graph's capture (the kernels' random draws take a seed on the host, which every replay "
                "would repeat)")
    if device_type == "cuda" and (capability() or MIN_CAPABILITY) < MIN_CAPABILITY:
        major, minor = capability()
        return (f"a GPU of compute capability {major}.{minor} (the kernels need "
                f"{'.'.join(map(str, MIN_CAPABILITY))} or later: tensor-core bfloat16 products, 80 KB of shared "
                "memory)")
    if head_size > MAX_HEAD_SIZE:
        return f"head size {head_size} (the Triton kernels take up to {MAX_HEAD_SIZE})"
    return None


def deterministic_refusal(atomics):
    """Why a call whose backward adds gradients by float atomics (`atomics`: autograd records it and its kernels'
    backward is one pass) cannot take the kernels: torch's deterministic algorithms are on
    (torch.use_deterministic_algorithms, warn_only too), and the atomics' order, so the last bits of the
    gradients, varies run to run. None otherwise."""
    if atomics and torch.are_deterministic_algorithms_enabled():
        return ("deterministic algorithms (torch.use_deterministic_algorithms): the kernels' backward adds gradients "
                "by float atomics, in an order that varies run to run")
    return None


def shape_class(head_size, num_global=1):
    """The shapes one tuning of the block sizes holds for: the padded width of a program's q / k / v rows,
    "w<next_power_of_2(num_global) x next_power_of_2(head_size)>" (MGK: num_global 1; FiSH: its M global heads,
    whose (M, rows, keys) score block bounds the rows). The defaults change with it, so a tuning does too."""
    pow2 = 1 << max(head_size - 1, 0).bit_length()
    return f"w{(1 << max(num_global - 1, 0).bit_length()) * max(pow2, 16)}"


_UNCLASSED_SAID = set()


def tuned_blocks(family, default, shape=None):
    """(BLOCK_M, BLOCK_N) of a family's kernels ("mgk", "fish") for a call of shape class `shape` (`shape_class`):
    `default`, or what HF_MGK_TRITON_BLOCKS says for it. An entry "family:class=MxN" (as hf_mgk.benchmark.tune
    prints it after timing the candidates on a GPU at one shape) applies to that class only; "family=MxN" to
    every shape, which is said once in a warning (a tuning holds for the shape it was timed at). Read at each
    call, so a process can compare candidates. A malformed entry is a ValueError naming the variable."""
    chosen, general = None, None
    for item in os.environ.get("HF_MGK_TRITON_BLOCKS", "").split(","):
        item = item.strip()
        if not item:
            continue
        name, _, sizes = item.partition("=")
        name, _, cls = name.strip().partition(":")
        rows, _, keys = sizes.strip().partition("x")
        if not (rows.isdigit() and keys.isdigit()) or name not in ("mgk", "fish"):
            raise ValueError(f"HF_MGK_TRITON_BLOCKS: cannot read {item!r}; write entries as family:class=MxN or "
                             "family=MxN, e.g. mgk:w64=64x64,fish:w128=64x32 (what hf_mgk.benchmark.tune prints)")
        if name != family:
            continue
        if not cls:
            general = (int(rows), int(keys))
        elif cls == shape:
            chosen = (int(rows), int(keys))
    if chosen is not None:
        return chosen
    if general is not None:
        if family not in _UNCLASSED_SAID:
            _UNCLASSED_SAID.add(family)
            logger.warning("HF_MGK_TRITON_BLOCKS gives %s's blocks %dx%d for every shape; a tuning holds for the shape "
                           "it was timed at (write %s:<class>=MxN, as hf_mgk.benchmark.tune prints, to keep the "
                           "defaults elsewhere)", family, *general, family)
        return general
    return default


# Shared memory one program may use, by compute capability (bytes): what decides whether a tile shape fits.
SHARED_MEMORY = {80: 163 * 1024, 87: 163 * 1024, 90: 227 * 1024, 100: 227 * 1024}
SMALL_SHARED_MEMORY = 99 * 1024  # sm_86 / sm_89 / sm_120 (consumer GPUs), the least among Triton's targets
_SHARED = {}


def shared_memory(device):
    """The shared memory (bytes) one program may use on CUDA `device`: Triton's driver's answer, else by compute
    capability (SHARED_MEMORY); None for a CPU tensor (the interpreter has no such limit)."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SHARED:
        try:
            _SHARED[index] = int(triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"])
        except Exception:  # noqa: BLE001 - a driver API that moved: the table by capability
            major, minor = torch.cuda.get_device_capability(index)
            _SHARED[index] = SHARED_MEMORY.get(10 * major + minor, SMALL_SHARED_MEMORY)
    return _SHARED[index]


def fitted(blocks, dtype):
    """A family's default GPU (BLOCK_M, BLOCK_N) for a call in `dtype`: as they are, or halved (to 16 at least) for
    float32. float32 tiles take twice half precision's bytes, and FiSH's tiles in flight (3 stages) at the
    half-precision defaults then need 100-180 KB on sm_86 and up to 256 KB (its dQ kernel, the query folded over M
    global heads) on sm_90; halved, they fit the 99 KB of sm_86 (compiled and checked in the slow tests) and
    Hopper's 227 KB."""
    if dtype == torch.float32:
        return tuple(max(16, b // 2) for b in blocks)
    return tuple(blocks)


def precision(dtype, device_type, float32="ieee"):
    """The kernels' PREC constant: half precision as it is; bfloat16 in the interpreter "upcast" (see `dot`);
    float32 in IEEE products in the interpreter, and on a GPU `float32`: "ieee" (TF32, the GPU default, would cost
    float32 calls their 1e-5 agreement), or "tf32x3" (three TF32 products per product, ~1e-7 relative, on the
    tensor cores) where no cancelling sum amplifies that error (FiSH; MGK's scores are such a sum)."""
    if dtype == torch.float32:
        return "ieee" if device_type == "cpu" else float32
    return "upcast" if dtype == torch.bfloat16 and device_type == "cpu" else None


if triton is not None:

    @triton.jit
    def dot(a, b, PREC: tl.constexpr):
        """a @ b (2-D, or batched 3-D) with float32 accumulation. PREC "ieee" for float32 (not TF32), None for half
        precision, "upcast" for bfloat16 in the interpreter, whose tl.dot reads bfloat16 as integers: the operands,
        already rounded to bfloat16, as float32 (the same products)."""
        if PREC == "upcast":
            return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        return tl.dot(a, b, input_precision=PREC)

    @triton.jit
    def key_end(start_m, BLOCK_M, N, S, CAUSAL: tl.constexpr):
        """The end of the keys a block of query rows from start_m may see: all S, or causal (bottom-right aligned:
        query i sees key j <= i + S - N) up to its last row's."""
        end = S
        if CAUSAL:
            end = tl.minimum(S, start_m + BLOCK_M + S - N)
        return end

    @triton.jit
    def query_start(start_n, BLOCK_M, N, S, CAUSAL: tl.constexpr):
        """The first block of query rows (a multiple of BLOCK_M) that sees a key from start_n on: 0, or causal the
        block of the first query i >= start_n - (S - N)."""
        start = 0
        if CAUSAL:
            start = tl.maximum(0, start_n - (S - N)) // BLOCK_M * BLOCK_M
        return start

    @triton.jit
    def online_softmax(a, m_i, l_i):
        """One block of scores a (rows x keys, -inf where hidden) into the online softmax's running maximum m_i and
        sum l_i: (P = exp(a - m_new), the factor alpha rescaling the earlier blocks, m_new, l_new); rows that have
        seen nothing yet keep P 0. exp2(a log2 e - m log2 e), one FMA a score (the flash baseline's form; backward
        forms P from A - m exactly, where its cancelling sums need it)."""
        m_new = tl.maximum(m_i, tl.max(a, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new) * _LOG2E_C
        p = tl.exp2(a * _LOG2E_C - m_use[:, None])
        alpha = tl.exp2(m_i * _LOG2E_C - m_use)
        return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)

    @triton.jit
    def softmax_state(BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr):
        """The online softmax's start for a block of query rows: running maximum -inf, sum 0, output 0."""
        return (tl.full([BLOCK_M], float("-inf"), tl.float32), tl.zeros([BLOCK_M], tl.float32),
                tl.zeros([BLOCK_M, BLOCK_DV], tl.float32))

    # Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011), as Triton's (the
    # generator of tl.randint4x), with each 32 x 32-bit product written as one 64-bit one (ptxas: one IMAD.WIDE.U32
    # for high and low word; as umulhi + mul it paired them less often, ~62 instructions a call in the FiSH forward
    # against ~54) and the stream in the key's second word (the counter's other words 0: its first round folds).
    _ROUND_A, _ROUND_B = tl.constexpr(0xD2511F53), tl.constexpr(0xCD9E8D57)
    _KEY_A, _KEY_B = tl.constexpr(0x9E3779B9), tl.constexpr(0xBB67AE85)

    @triton.jit
    def _mul_hi_lo(a, b: tl.constexpr):
        p = a.to(tl.uint64) * b
        return (p >> 32).to(tl.uint32), p.to(tl.uint32)

    @triton.jit
    def philox4(c0, k0, k1):
        """The four 32-bit words of Philox4x32-10 for counters (c0, 0, 0, 0) (c0 uint32 of any shape) and key (k0,
        k1) (scalars)."""
        c1 = c0 * 0
        c2 = c1
        c3 = c1
        k0 = k0.to(tl.uint32)
        k1 = k1.to(tl.uint32)
        for _ in tl.static_range(10):
            hi0, lo0 = _mul_hi_lo(c0, _ROUND_A)
            hi2, lo2 = _mul_hi_lo(c2, _ROUND_B)
            c0, c1, c2, c3 = hi2 ^ c1 ^ k0, lo2, hi0 ^ c3 ^ k1, lo0
            k0 = tl.add(k0, _KEY_A, sanitize_overflow=False)
            k1 = tl.add(k1, _KEY_B, sanitize_overflow=False)
        return c0, c1, c2, c3

    _TWO_PI_2_32 = tl.constexpr(6.283185307179586 / 2**32)
    _LOG2E_C = tl.constexpr(LOG2E)
    _MINUS_2_LN2 = tl.constexpr(-2 * LN2)
    # lg2.approx, sin.approx, cos.approx on a GPU: one MUFU each (relative error < 2^-22 for lg2, absolute < 2^-20.9
    # for sin / cos on [-pi, pi], the angle's range here), where tl.log2 / tl.sin / tl.cos are libdevice's float32
    # polynomials (~15 FMA each, sin / cos with a slow argument reduction); the interpreter has no libdevice, so
    # numpy's there (the same draws to float32's rounding).
    _FAST_MATH = tl.constexpr(not _INTERPRETED)
    if not _INTERPRETED:
        from triton.language.extra.cuda import libdevice as _libdevice

    @triton.jit
    def _box_muller(i, t):
        """Both normals of the Box-Muller transform of two 32-bit words: radius from i, uniform in (0, 1] as
        (i + 1/2) 2^-32 (never 0: the radius reaches 6.7 sigma); angle from t as a signed word, in [-pi, pi)."""
        u = i.to(tl.float32) * (1.0 / 2**32) + (0.5 / 2**32)
        theta = t.to(tl.int32, bitcast=True).to(tl.float32) * _TWO_PI_2_32
        if _FAST_MATH:
            r = tl.sqrt(_libdevice.fast_log2f(u) * _MINUS_2_LN2)
            return r * _libdevice.fast_cosf(theta), r * _libdevice.fast_sinf(theta)
        r = tl.sqrt(tl.log2(u) * _MINUS_2_LN2)
        return r * tl.cos(theta), r * tl.sin(theta)

    @triton.jit
    def normal_tile(seed, stream, base, start_n, BLOCK_N: tl.constexpr):
        """Standard normals (R, BLOCK_N) for rows with counter bases `base` (R,) and the columns start_n + [0,
        BLOCK_N) (start_n a multiple of 4): element (r, n) is normal (0, 2, 1, 3)[n % 4] of Philox's call at counter
        (base_r + n // 4, 0, 0, 0) under key (seed, stream), normals 0, 1 the Box-Muller pair of words 0, 1 and 2, 3
        that of words 2, 3 (the order tl.join's nesting gives). The key's second word tells draws apart (a batch x head): unlike seed
        + offset keys, two calls' or heads' streams never overlap. Every word of a call is used (two Box-Muller pairs:
        four normals), where tl.randn uses one normal of a call and throws three words away; counter-based, so
        backward regenerates it."""
        c = (base[:, None] + (start_n // 4 + tl.arange(0, BLOCK_N // 4))[None, :]).to(tl.uint32)
        i0, i1, i2, i3 = philox4(c, seed, stream)
        z0, z1 = _box_muller(i0, i1)
        z2, z3 = _box_muller(i2, i3)
        return tl.reshape(tl.join(tl.join(z0, z1), tl.join(z2, z3)), (base.shape[0], BLOCK_N))

    @triton.jit
    def keep(seed, bh, offs_m, start_n, S, P_DROP, BLOCK_N: tl.constexpr):
        """Dropout's mask of a tile: True where the weight of (query offs_m, key start_n + [0, BLOCK_N)) is kept
        (start_n a multiple of 4; a key-major kernel transposes it). Counter-based, so the forward and the backward
        kernels draw the same bits: one Philox call per (query, 4 keys), at counter i ceil(S / 4) + j // 4 under the
        key (seed, 2^31 + batch x head: never one of the noise's streams, which are below 2^31), each of its four
        words kept where it is at least p 2^32, so P(keep) = 1 - p to float32's rounding of p. tl.rand took a call
        per pair (and three words thrown away, a conversion to float): ~4 times the instructions (kernel notes)."""
        c = (offs_m[:, None] * ((S + 3) // 4) + (start_n // 4 + tl.arange(0, BLOCK_N // 4))[None, :]).to(tl.uint32)
        i0, i1, i2, i3 = philox4(c, seed, bh.to(tl.uint32) + 0x80000000)
        # p 2^32 below 2^32 (float32's largest under it) so that it converts; p < 1 drops nothing more by it
        thr = tl.minimum(P_DROP * 4294967296.0, 4294967040.0).to(tl.uint32)
        kept = tl.join(tl.join(i0 >= thr, i1 >= thr), tl.join(i2 >= thr, i3 >= thr))
        return tl.reshape(kept, (offs_m.shape[0], BLOCK_N))

    @triton.jit
    def free_keys_end(start_m, BLOCK_N: tl.constexpr, N, S, CAUSAL: tl.constexpr):
        """The end of the key blocks (from 0) that need no mask for the query rows start_m + [0, BLOCK_M): whole
        blocks within S that, causal, even the first row sees entirely. Blocks from here to key_end are masked."""
        end = S // BLOCK_N * BLOCK_N
        if CAUSAL:
            end = tl.minimum(end, tl.maximum(start_m + S - N + 1, 0) // BLOCK_N * BLOCK_N)
        return end

    @triton.jit
    def free_queries_start(start_n, lo, BLOCK_M: tl.constexpr, BLOCK_N, N, S, CAUSAL: tl.constexpr):
        """The first block of query rows (from `lo`, query_start's) that sees every key of start_n + [0, BLOCK_N)
        (causal: its first row), at most the end of the whole row blocks; blocks before it are masked, and the blocks
        from the end of the whole row blocks on (rows past N). The blocks it frees are not bounds-masked: where the
        key block passes S, its keys past S must be -inf by other means (the FiSH backward then takes the padding
        bias, whose loads give -inf past S), or they take weight, and every sum over keys (the mixing's gradients)
        with it."""
        start = lo
        if CAUSAL:
            first = tl.maximum(start_n + BLOCK_N - 1 - (S - N), 0)
            start = tl.maximum(lo, (first + BLOCK_M - 1) // BLOCK_M * BLOCK_M)
        return tl.minimum(start, tl.maximum(lo, N // BLOCK_M * BLOCK_M))
