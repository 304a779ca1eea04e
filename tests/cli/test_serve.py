"""Stopping `nano-infer serve` the two usual ways prints nothing that looks like a failure.

The server runs as a real subprocess on a free loopback port and answers a constrained request
first, so its constraint compile pool (worker processes, and the two semaphores of their channel)
exists when the signal comes. SIGTERM (what a service manager or `kill` sends) goes to the server
alone; Ctrl-C goes to the terminal's whole process group, compile workers included.
"""
import concurrent.futures
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers.engine_checks import free_port, wait_until_serving

pytestmark = pytest.mark.slow  # a real `nano-infer serve` process per test
STOP_S = 60
NANO_INFER = Path(sys.executable).with_name("nano-infer")  # the console script, installed beside this Python


@pytest.mark.parametrize("stop", ["sigterm", "ctrl-c"])
def test_stopping_serve_leaks_nothing_and_prints_no_traceback(qwen2_dir, stop):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([str(NANO_INFER), "serve", "--model", str(qwen2_dir), "--port", str(port),
                             "--served-model-name", "tiny", "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_until_serving(proc, url)
        reply = httpx.post(url + "/v1/completions", timeout=STOP_S, json={
            "model": "tiny", "prompt": "To be", "max_tokens": 8, "guided_regex": "(yes|no)"})
        assert reply.status_code == 200 and reply.json()["choices"][0]["text"] in ("yes", "no"), reply.text
        if stop == "sigterm":
            proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        _, err = proc.communicate(timeout=STOP_S)  # until every process holding its stderr is gone
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert "leaked semaphore" not in err, err
    assert "Traceback" not in err, err
    assert proc.returncode == 0, err


# One process and two ranks, each with a host tier: the tier adds its pool and plug-in to what starts and stops,
# so these cover every part a plain server starts too.
MODES = {"tp1-tier": ["--kv-offloading-size", "0.01"],
         "tp2-tier": ["--tensor-parallel-size", "2", "--kv-offloading-size", "0.01"]}


def ctrl_c_after_start(qwen2_dir, mode: str, delay: float) -> tuple[int, str]:
    """(exit status, stderr) of a server sent Ctrl-C `delay` s after /health first answers."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([str(NANO_INFER), "serve", "--model", str(qwen2_dir), "--port", str(port),
                             "--log-level", "warning", *MODES[mode]],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_until_serving(proc, url)
        time.sleep(delay)
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        _, err = proc.communicate(timeout=STOP_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc.returncode, err


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_ctrl_c_right_after_start_prints_no_traceback_in_any_mode(qwen2_dir, mode):
    """Ctrl-C as soon as /health answers, while the compile pool's fork server and workers (and the
    tensor-parallel workers) are still importing: the race that printed a KeyboardInterrupt or a
    `SemLock._rebuild` FileNotFoundError traceback in one try of three. Three servers per mode, side by
    side (each start-up is mostly waiting on imports), each stopped at a different moment."""
    delays = (0.0, 0.2, 1.0)
    with concurrent.futures.ThreadPoolExecutor(len(delays)) as pool:
        results = list(pool.map(lambda delay: ctrl_c_after_start(qwen2_dir, mode, delay), delays))
    for delay, (returncode, err) in zip(delays, results):
        assert "Traceback" not in err and "Fatal Python error" not in err, f"{mode}, Ctrl-C {delay} s after start:\n{err}"
        assert "leaked semaphore" not in err, err
        assert returncode == 0, (mode, delay, err)

def test_a_busy_port_is_an_error_before_the_model_loads(tmp_path):
    """The port is taken first: a busy one is named at once (the model here does not even exist)."""
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run([str(NANO_INFER), "serve", "--model", str(tmp_path / "no-such-model"), "--port", str(port)],
                              capture_output=True, text=True, timeout=STOP_S)
    assert done.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "no-such-model" not in done.stderr, done.stderr
