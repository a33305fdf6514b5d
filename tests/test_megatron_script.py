"""The generated torchrun script, run by bash with torchrun replaced by `echo` (via PATH):
multi-node launches fail fast without MASTER_ADDR / NODE_RANK instead of hanging; single-node
ones default to localhost; FSDP launches clear CUDA_DEVICE_MAX_CONNECTIONS even if inherited;
checkpoints and throughput logs are in the launch."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from hardware import load_system
from planner import megatron as mg
from planner.model import load_model
from planner.plan import JobSpec, Plan

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _script(tmp_path: Path, gpus: int, **plan) -> Path:
    m, s = load_model("llama3-8b"), load_system("h100-sxm", gpus)
    launch = mg.megatron_args(Plan(**plan), m, JobSpec(), s, save_interval=250)
    path = tmp_path / "launch.sh"
    path.write_text(mg.render(launch, "script"))
    return path


def _run(script: Path, tmp_path: Path, **env) -> subprocess.CompletedProcess:
    """bash script with a fake torchrun that prints its arguments and CUDA_DEVICE_MAX_CONNECTIONS."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "torchrun"
    fake.write_text('#!/usr/bin/env bash\necho "torchrun $* CDMC=${CUDA_DEVICE_MAX_CONNECTIONS-unset}"\n')
    fake.chmod(0o755)
    (tmp_path / "pretrain_gpt.py").touch()  # run from a Megatron-LM checkout
    base = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "DATA_PATH": "/data/prefix"}
    return subprocess.run(["bash", str(script)], env={**base, **env}, capture_output=True, text=True,
                          timeout=30, cwd=tmp_path)


def test_two_node_launch_fails_fast_without_rendezvous(tmp_path):
    script = _script(tmp_path, 16, dp=16, micro_batch=1, global_batch=64)
    missing_addr = _run(script, tmp_path, NODE_RANK="1")
    assert missing_addr.returncode != 0 and "MASTER_ADDR" in missing_addr.stderr
    assert "torchrun" not in missing_addr.stdout  # stopped before launching anything
    missing_rank = _run(script, tmp_path, MASTER_ADDR="node0")
    assert missing_rank.returncode != 0 and "NODE_RANK" in missing_rank.stderr
    # every node must write the same checkpoint: a relative default would be node-local
    no_ckpt = _run(script, tmp_path, MASTER_ADDR="node0", NODE_RANK="1")
    assert no_ckpt.returncode != 0 and "CHECKPOINT_DIR" in no_ckpt.stderr
    for rank in ("2", "x", "-1"):  # a rank is a whole number below NNODES
        bad = _run(script, tmp_path, MASTER_ADDR="node0", NODE_RANK=rank, CHECKPOINT_DIR="/shared/ckpt")
        assert bad.returncode != 0 and "NODE_RANK" in bad.stderr and "torchrun" not in bad.stdout, rank
    ok = _run(script, tmp_path, MASTER_ADDR="node 0", NODE_RANK="1", CHECKPOINT_DIR="/shared/ckpt")
    assert ok.returncode == 0, ok.stderr
    assert "--nnodes 2 --nproc-per-node 8 --node-rank 1 --master-addr node 0" in ok.stdout
    words = ok.stdout.split()
    assert words[words.index("--save-interval") + 1] == "250" and "--log-throughput" in words
    assert words[words.index("--data-path") + 1] == "/data/prefix"
    assert words[words.index("--save") + 1] == words[words.index("--load") + 1] == "/shared/ckpt"
    assert "--tokenizer-model" not in words  # the null tokenizer reads no model files
    hf = _run(script, tmp_path, MASTER_ADDR="node0", NODE_RANK="1", CHECKPOINT_DIR="/c",
              TOKENIZER_TYPE="HuggingFaceTokenizer")
    assert hf.returncode != 0 and "TOKENIZER_MODEL" in hf.stderr
    hf = _run(script, tmp_path, MASTER_ADDR="node0", NODE_RANK="1", CHECKPOINT_DIR="/c",
              TOKENIZER_TYPE="HuggingFaceTokenizer", TOKENIZER_MODEL="/tok")
    assert hf.returncode == 0 and "--tokenizer-model /tok" in hf.stdout, hf.stderr


def test_single_node_defaults_and_fsdp_clears_max_connections(tmp_path):
    script = _script(tmp_path, 8, dp=8, micro_batch=1, global_batch=64, zero_stage=3)
    run = _run(script, tmp_path, CUDA_DEVICE_MAX_CONNECTIONS="1")  # inherited from the cluster env
    assert run.returncode == 0, run.stderr
    assert "--nnodes 1 --nproc-per-node 8 --node-rank 0 --master-addr localhost" in run.stdout
    assert "CDMC=unset" in run.stdout
    dense = _script(tmp_path, 8, dp=8, micro_batch=1, global_batch=64)
    assert "CDMC=1" in _run(dense, tmp_path).stdout
    # one node is rank 0 on localhost, whatever the environment says
    assert "--master-addr localhost" in _run(dense, tmp_path, MASTER_ADDR="10.0.0.1").stdout
    wrong = _run(dense, tmp_path, NODE_RANK="1")
    assert wrong.returncode != 0 and "rank 0" in wrong.stderr


def test_the_script_runs_only_from_a_megatron_checkout(tmp_path):
    script = _script(tmp_path, 8, dp=8, micro_batch=1, global_batch=64)
    (tmp_path / "elsewhere").mkdir()
    run = subprocess.run(["bash", str(script)], env={"PATH": os.environ["PATH"], "DATA_PATH": "/d"},
                         capture_output=True, text=True, timeout=30, cwd=tmp_path / "elsewhere")
    assert run.returncode != 0 and "Megatron-LM checkout" in run.stderr
