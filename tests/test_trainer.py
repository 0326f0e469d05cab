"""Loss under Trainer: gradient accumulation and two processes give the step of the whole batch at once."""

import os

import pytest
import torch

from conftest import assert_close, run_torchrun
from trainer_check import train_once

HERE = os.path.dirname(__file__)


@pytest.mark.parametrize("task", ["mlm", "cls", "clm", "clm-mgk"])
def test_gradient_accumulation_matches_the_whole_batch(task, tmp_path):
    loss_full, params_full = train_once(task, per_device_batch=4, accumulation=1, output_dir=str(tmp_path / "a"))
    loss_acc, params_acc = train_once(task, per_device_batch=2, accumulation=2, output_dir=str(tmp_path / "b"))
    loss_acc1, params_acc1 = train_once(task, per_device_batch=1, accumulation=4, output_dir=str(tmp_path / "c"))
    assert loss_acc == pytest.approx(loss_full, rel=1e-5)
    assert loss_acc1 == pytest.approx(loss_full, rel=1e-5)
    assert_close(params_acc, params_full, rtol=1e-5)
    assert_close(params_acc1, params_full, rtol=1e-5)


@pytest.mark.parametrize("task", ["mlm", "clm", "clm-mgk"])
def test_trainer_loss_is_the_mean_over_the_predicted_tokens(task, tmp_path):
    """Trainer divides the summed loss by its own count of label tokens: for a causal LM that count must be over
    the shifted labels (transformers checks `model.loss_type`), else the loss is scaled by (N - 1) / N."""
    from trainer_check import FixedBatch, build_model

    items = FixedBatch(task).items
    batch = {k: torch.stack([item[k] for item in items]) for k in items[0]}
    with torch.no_grad():
        expected = build_model(task)(**batch).loss.item()  # the plain mean over the batch's predicted tokens
    loss, _ = train_once(task, per_device_batch=4, accumulation=1, output_dir=str(tmp_path))
    assert loss == pytest.approx(expected, rel=1e-6)


TWO_PROCESS_TASKS = ["mlm", "clm"]


@pytest.fixture(scope="module")
def two_process_runs(tmp_path_factory):
    """torchrun with gloo on CPU, 2 processes x batch 1 x accumulation 2, each task's run in turn in the same
    processes (one launch, not one per task): {task: {"loss", "params"}}."""
    out = tmp_path_factory.mktemp("ddp") / "result.pt"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.path.join(HERE, "..", "src")}
    proc = run_torchrun([os.path.join(HERE, "trainer_check.py"), "--task", *TWO_PROCESS_TASKS, "--batch", "1",
                         "--accumulation", "2", "--out", str(out)], env, timeout=240, done=out)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(out)


@pytest.mark.slow
@pytest.mark.parametrize("task", TWO_PROCESS_TASKS)
def test_two_processes_match_one(task, two_process_runs, tmp_path):
    """torchrun with gloo on CPU: 2 processes x batch 1 x accumulation 2 == 1 process x batch 4."""
    loss_full, params_full = train_once(task, per_device_batch=4, accumulation=1, output_dir=str(tmp_path / "a"))
    ddp = two_process_runs[task]
    assert ddp["loss"] == pytest.approx(loss_full, rel=1e-5)
    assert_close(ddp["params"], params_full, rtol=1e-5)


def test_a_hung_process_fails_the_test_with_its_stack(tmp_path):
    """run_torchrun's bound: a process that never exits is stopped after the time-out and the failure shows where
    each of its threads was (faulthandler on SIGABRT), instead of hanging the suite."""
    import sys

    from conftest import run_bounded

    code = "def waiting_for_a_peer():\n    import time\n    time.sleep(600)\nwaiting_for_a_peer()\n"
    with pytest.raises(pytest.fail.Exception, match=r"(?s)did not finish in 2s.*waiting_for_a_peer"):
        run_bounded([sys.executable, "-c", code], dict(os.environ), timeout=2)
    # torchrun's ranks run in sessions of their own: one that hangs is stopped too (and its stack shown), and
    # does not keep the output pipes, and with them the suite, waiting
    rank = "import time\ndef a_rank_in_its_own_session():\n    time.sleep(600)\na_rank_in_its_own_session()\n"
    launcher = (f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {rank!r}], "
                "start_new_session=True)\ntime.sleep(600)\n")
    # `stacks` sees the launcher and its rank before they are stopped, and comes first in the failure
    with pytest.raises(pytest.fail.Exception,
                       match=r"(?s)did not finish in 2s.*2 processes seen alive\n.*a_rank_in_its_own_session"):
        run_bounded([sys.executable, "-c", launcher], dict(os.environ), timeout=2,
                    stacks=lambda pids: f"{len(pids)} processes seen alive\n")
    # a process that wrote its results and then hangs is caught `grace` seconds after the file appeared, long
    # before the bound of the whole run
    marker = tmp_path / "results.json"
    saved = f"import pathlib, time\ndef saved_then_stuck():\n    pathlib.Path({str(marker)!r}).write_text('{{}}')\n" \
            "    time.sleep(600)\nsaved_then_stuck()\n"
    with pytest.raises(pytest.fail.Exception, match=r"(?s)wrote results.json and did not exit within 1s.*saved_then"):
        run_bounded([sys.executable, "-c", saved], dict(os.environ), timeout=300, done=marker, grace=1)
    done = run_bounded([sys.executable, "-c", "print('done')"], dict(os.environ), timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "done"


@pytest.mark.slow  # four interpreters that import transformers
def test_a_rank_under_a_launcher_leaves_from_inside_main_once_its_work_is_written():
    """training.run_script: under a launcher (WORLD_SIZE > 1) the rank exits 0 in close_distributed(), at the end of
    main(), its output flushed: nothing after it runs, main()'s locals are never freed (freeing the DDP model there
    is where a gloo rank deadlocked) and the interpreter's teardown is skipped. Alone, main() returns and the
    process ends as usual; a main() without close_distributed() still leaves at run_script; an error in main still
    fails the process with its traceback."""
    import subprocess
    import sys

    code = ("import atexit\nfrom hf_mgk.training import close_distributed, run_script\n"
            "atexit.register(lambda: print('teardown'))\nclass Local:\n    def __del__(self):\n"
            "        print('freed', end='')\n"
            "def main():\n    local = Local()\n    print('work', end='')\n    {}\n    print('after', end='')\n"
            "run_script(main)\n")

    def start(body, **env):  # the interpreters run at once: each spends seconds importing transformers
        return subprocess.Popen([sys.executable, "-c", code.format(body)], env={**os.environ, **env},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    procs = [start("close_distributed()", WORLD_SIZE="2"), start("close_distributed()"), start("pass", WORLD_SIZE="2"),
             start("raise RuntimeError('broken')", WORLD_SIZE="2")]
    (ranked, _), (alone, _), (no_close, _), (_, failed) = (p.communicate(timeout=120) for p in procs)
    assert (procs[0].returncode, ranked) == (0, "work")
    assert (procs[1].returncode, alone) == (0, "workafterfreedteardown\n")
    assert (procs[2].returncode, no_close) == (0, "workafterfreed")
    assert procs[3].returncode == 1 and "RuntimeError: broken" in failed


def test_close_distributed_keeps_the_process_group_alive(tmp_path):
    """After close_distributed() the default group is no longer initialised, but its object (the one DDP's
    reducer holds) is kept: freeing the DDP model later, with the GIL held, must not run the group's destructor,
    which waits for gloo's worker thread while that thread may wait for the GIL."""
    import torch.distributed as dist

    from hf_mgk.training import run_dir

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 2))
        model(torch.ones(4, 3)).sum().backward()
        group = model.process_group
        kept = len(run_dir._KEPT_GROUPS)
        run_dir.close_distributed()
        assert not dist.is_initialized()
        assert len(run_dir._KEPT_GROUPS) == kept + 1 and run_dir._KEPT_GROUPS[-1] is group
        del model  # the reducer's reference goes; the group's stays
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
