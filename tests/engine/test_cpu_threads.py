"""The engine's CPU threads follow the cores other processes leave free (engine/cpu_threads.py)."""
import os
import shlex
import signal
import subprocess
import sys
import time
import types

import pytest
import torch

from nano_infer.engine import cpu_threads
from nano_infer.engine.cpu_threads import STAT, FreeCoreThreads


@pytest.fixture
def torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_threads_are_the_cores_other_processes_leave(torch_threads):
    """Samples of (wall, every process's busy CPU seconds, this process's): the others' share decides."""
    torch.set_num_threads(4)
    policy = FreeCoreThreads(max_threads=4, cores=4)
    policy._last = (0.0, 0.0, 0.0)
    steps = [((1.0, 2.0, 1.0), 3),  # the others took one core's worth: three left
             ((2.0, 4.6, 2.0), 2),  # 2.6 busy less 1.0 of ours: 1.6 cores, two taken
             ((3.0, 6.0, 3.0), 4),  # 0.4 of a core: none taken
             ((4.0, 7.9, 3.5), 3)]  # 1.9 less 0.5: 1.4 cores, one taken
    for sample, threads in steps:
        policy.update(sample)
        assert policy.threads == threads == torch.get_num_threads(), (sample, policy.threads)
    assert policy.changes == 4


def test_never_more_than_torch_had_nor_fewer_than_one(torch_threads):
    torch.set_num_threads(1)
    policy = FreeCoreThreads(max_threads=1, cores=4)
    policy._last = (0.0, 0.0, 0.0)
    policy.update((1.0, 0.0, 0.0))  # nothing else runs: still the one thread a chapter pinned
    assert policy.threads == 1 and policy.changes == 0
    torch.set_num_threads(4)
    policy = FreeCoreThreads(max_threads=4, cores=4)
    policy._last = (0.0, 0.0, 0.0)
    policy.update((1.0, 10.0, 0.0))  # the others hold every core: one thread still
    assert policy.threads == 1 == torch.get_num_threads()


SPIN = [sys.executable, "-c", "while True: pass"]


def counted_over_a_second(policy: FreeCoreThreads) -> None:
    time.sleep(0.3)
    policy._last = policy._sample()
    time.sleep(1.0)
    policy.update(policy._sample())


@pytest.mark.skipif(not STAT.exists(), reason="reads Linux's /proc/stat")
def test_a_process_spinning_beside_the_engine_takes_a_thread(torch_threads):
    """Another process busy on one core, read from /proc/stat: at most cores - 1 threads are left (at least one;
    fewer when something else runs too). The spinner is started by a shell that exits at once: no child of ours."""
    torch.set_num_threads(2)
    policy = FreeCoreThreads.for_cpu()
    assert policy is not None and policy.max_threads == 2
    shell = subprocess.run(["sh", "-c", f"{shlex.join(SPIN)} >/dev/null 2>&1 & echo $!"],
                           capture_output=True, text=True, check=True)
    spinner = int(shell.stdout)
    try:
        assert spinner not in cpu_threads._children(os.getpid())
        counted_over_a_second(policy)
    finally:
        os.kill(spinner, signal.SIGKILL)
    assert 1 <= policy.threads <= max(1, policy.cores - 1), policy.threads  # on 2 cores: one


@pytest.mark.skipif(not STAT.exists(), reason="reads Linux's /proc/stat")
def test_a_process_the_engine_started_is_its_own_load(torch_threads):
    """A child process busy on one core (as inductor's compile workers are while the engine compiles its step):
    the engine's own work, so it takes no thread away; the CPU time it spent is counted as ours."""
    torch.set_num_threads(2)
    policy = FreeCoreThreads.for_cpu()
    spinner = subprocess.Popen(SPIN)
    try:
        before = cpu_threads.own_seconds()
        counted_over_a_second(policy)
        assert cpu_threads.own_seconds() - before >= 0.5  # most of the spinner's 1.3 s
    finally:
        spinner.kill()
        spinner.wait()
    # the others (anything else running now) may still take one; the spinner alone would have
    assert policy.threads == 2 or busy_elsewhere(), policy.threads


def busy_elsewhere() -> bool:
    """Whether something outside this process and its children takes a thread away now, by the plug-in's own count."""
    torch.set_num_threads(2)  # the policy under test may have set one
    probe = FreeCoreThreads.for_cpu()
    counted_over_a_second(probe)
    return probe.threads < probe.max_threads


def test_the_engine_on_a_cpu_has_the_plug_in_and_says_so(qwen2_dir, torch_threads):
    from nano_infer import LLM

    torch.set_num_threads(2)
    llm = LLM(str(qwen2_dir), dtype="float32")
    assert llm.engine.plugin(FreeCoreThreads).max_threads == 2
    assert "up to 2 threads (as many as cores are free)" in llm.engine.startup_line
    torch.set_num_threads(1)
    assert LLM(str(qwen2_dir), dtype="float32").engine.plugin(FreeCoreThreads) is None  # one thread: nothing to share


def test_threads_pinned_after_the_engine_started_stay_pinned(torch_threads):
    """A cell that pins one thread for its timings, after the engine was made: the policy never raises it."""
    torch.set_num_threads(2)
    policy = FreeCoreThreads(max_threads=2, cores=2)
    policy._last = (0.0, 0.0, 0.0)
    torch.set_num_threads(1)
    policy.update((1.0, 0.0, 0.0))  # nothing else runs
    assert policy.threads == policy.max_threads == 1 == torch.get_num_threads()


def test_what_others_did_while_the_engine_waited_for_work_does_not_count(torch_threads, monkeypatch):
    """Another process busy on both cores while the engine has no work (a benchmark's other engine): the first step
    after the wait keeps the engine's threads, and a count soon after reads only what the others do now."""
    now = [0.0]
    monkeypatch.setattr(cpu_threads, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    torch.set_num_threads(2)
    policy = FreeCoreThreads(max_threads=2, cores=2)
    timeline = {0.0: (0.0, 0.0), 5.0: (9.9, 0.04), 5.12: (10.14, 0.28)}  # t -> (every process's busy s, ours)
    policy._sample = lambda: (now[0], *timeline[now[0]])
    policy._last = policy._sample()
    policy.after_step(None)  # a step ends at 0, then nothing until 5: the others held both cores meanwhile
    now[0] = 5.0
    policy.adjust(None)
    assert policy.threads == 2 == torch.get_num_threads()  # the wait's load is not counted
    policy.after_step(None)
    now[0] = 5.12  # RECHECK_S later: the others took nothing since (ours 0.24 of the 0.24 busy)
    policy.adjust(None)
    assert policy.threads == 2 and policy.changes == 0
    # the next count: the others took 1.6 s in 1.08, a core and a half
    timeline[6.2] = (10.14 + 1.08 + 1.6, 0.28 + 1.08)
    now[0] = 6.19  # steps all along, the last one ending here
    policy.after_step(None)
    now[0] = 6.2
    policy.adjust(None)
    assert policy.threads == 1 == torch.get_num_threads()
