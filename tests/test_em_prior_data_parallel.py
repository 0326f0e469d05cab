"""The EM prior under data parallelism. Each rank holds a shard of the batch; the M-step sums the responsibilities
and their pair counts over the ranks, so that every rank's pi is the one a single process computes from the whole
batch (and the ranks never drift apart: DDP would otherwise broadcast rank 0's shard estimate, DeepSpeed and FSDP
keep one per rank). Two gloo ranks on the CPU, shards of different padding, against one process."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import hf_mgk
import tiny

pytestmark = pytest.mark.slow  # two ranks

FAMILIES = {
    "mgk-bert": ("MGKBertModel", "MGKBertConfig", "bert"),
    "mgk-gpt2": ("MGKGPT2Model", "MGKGPT2Config", "gpt2"),
}


def batch():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 90, (4, 12), generator=g)
    mask = torch.ones(4, 12, dtype=torch.long)
    mask[1, 7:] = 0  # the shards differ in their valid pairs: a mean of the two shard means would be wrong
    mask[2, 4:] = 0
    mask[3, 10:] = 0
    return ids, mask


def model(family):
    cls, config_cls, fields = FAMILIES[family]
    torch.manual_seed(0)
    config = getattr(hf_mgk, config_cls)(**getattr(tiny, fields)(dropout=False), attention_type="mgk",
                                         mgk_prior="em")
    return getattr(hf_mgk, cls)(config).train()


def priors(net, ids, mask, steps=2):
    """Each layer's pi after `steps` training forwards (the second uses the first's estimate in its E-step)."""
    for _ in range(steps):
        net(input_ids=ids, attention_mask=mask)
    return [m.prior.clone() for m in net.modules() if getattr(m, "prior_type", None) == "em"]


_RANKS = '''
import os, socket, sys
import torch
import torch.distributed as dist

def rank_main(rank, world, out, port, family):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import test_em_prior_data_parallel as t
    ids, mask = t.batch()
    shard = slice(2 * rank, 2 * rank + 2)
    torch.save(t.priors(t.model(family), ids[shard], mask[shard]), os.path.join(out, f"{family}-{rank}.pt"))
    dist.destroy_process_group()

if __name__ == "__main__":
    out, family = sys.argv[1], sys.argv[2]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(rank_main, args=(2, out, port, family), nprocs=2)
'''


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_rank_takes_the_whole_batch_pi(tmp_path, family):
    script = tmp_path / "ranks.py"
    script.write_text(textwrap.dedent(_RANKS))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(script), str(tmp_path), family], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    ids, mask = batch()
    whole = priors(model(family), ids, mask)
    for rank in range(2):
        got = torch.load(tmp_path / f"{family}-{rank}.pt")
        for layer, (g, w) in enumerate(zip(got, whole)):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, msg=f"rank {rank}, layer {layer}")
    # and the test can tell: a shard alone estimates another pi
    alone = priors(model(family), ids[:2], mask[:2])
    assert max((a - w).abs().max().item() for a, w in zip(alone, whole)) > 1e-4
