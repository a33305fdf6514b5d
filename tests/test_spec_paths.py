"""What `-s`/`-m`/`--plan` name is checked for what it is, and the one line says what is wrong: a
folder where a YAML file is expected, a device or pipe (/dev/null, a FIFO) that is no file, an
empty name. Before, all of these read "file ... does not exist" (or, for /dev/null as a plan,
"the file is empty"; a FIFO as a plan file blocked forever)."""
from __future__ import annotations

import os
import threading
import warnings
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from hardware.errors import SpecError, read_yaml_mapping, resolve_preset_or_file
from hardware.load import PRESET_DIR, load_system
from planner.cli.app import app
from tests.conftest import one_line_error

ROOT = Path(__file__).resolve().parents[1]
CUSTOM = ROOT / "examples" / "custom_system.yaml"
runner = CliRunner()
needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this platform")


def _invoke(*args: str):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning (nor any other) on the way to the error
        return runner.invoke(app, list(args))



def _plan_with_system(ref: str):
    return _invoke("plan", "-m", "llama3-8b", "-s", ref, "-g", "8", "-b", "64")


# --- -s: a folder, a special file, an empty name ---------------------------------------------------

@pytest.mark.parametrize("suffix", ["", "/", ".yaml"], ids=["folder", "folder-slash", "folder-named-yaml"])
def test_system_folder_is_named_a_folder(tmp_path, suffix):
    folder = tmp_path / ("sys.yaml" if suffix == ".yaml" else "sys")
    folder.mkdir()
    ref = str(folder) + ("/" if suffix == "/" else "")
    line = one_line_error(_plan_with_system(ref))
    assert line.startswith(f"error: system: {ref} is a folder, expected a YAML file"), line
    assert "does not exist" not in line


@pytest.mark.skipif(not Path("/dev/null").exists(), reason="no /dev/null")
@pytest.mark.parametrize("command", ["plan", "estimate"])
def test_dev_null_is_not_a_regular_file(command):
    line = one_line_error(_invoke(command, "-m", "llama3-8b", "-s", "/dev/null", "-g", "8"))
    assert line == ("error: system: /dev/null is not a regular file (a device, pipe or socket), "
                    "expected a YAML file"), line


@needs_fifo
def test_fifo_system_is_not_a_regular_file(tmp_path):
    fifo = tmp_path / "sys.yaml"
    os.mkfifo(fifo)
    line = one_line_error(_plan_with_system(str(fifo)))
    assert f"system: {fifo} is not a regular file" in line, line


@pytest.mark.parametrize("ref,command", [
    ("", "plan"), (" ", "plan"), (" ", "estimate"), ("", "estimate")])
def test_empty_system_name(command, ref):
    line = one_line_error(_invoke(command, "-m", "llama3-8b", "-s", ref, "-g", "8"))
    assert line.startswith("error: system: empty name: give a preset name or a path"), line
    assert "does not exist" not in line


def test_empty_system_name_in_a_sweep(tmp_path):
    line = one_line_error(_invoke("sweep", "-m", "llama3-8b", "-s", "", "--vary", "gpus=8,16",
                                   "--out", str(tmp_path / "out")))
    assert "system: empty name: give a preset name or a path" in line, line


# --- the accelerator a system file names goes the same way ---------------------------------------

@pytest.mark.parametrize("accelerator,message", [
    ("", "accelerator: empty name: give a preset name or a path"),
    ("/dev/null", "accelerator: /dev/null is not a regular file"),
    ("FOLDER", "accelerator: FOLDER is a folder, expected a YAML file"),
], ids=["empty", "dev-null", "folder"])
def test_accelerator_reference_in_a_system_file(tmp_path, accelerator, message):
    if accelerator == "/dev/null" and not Path("/dev/null").exists():
        pytest.skip("no /dev/null")
    folder = tmp_path / "acc"
    folder.mkdir()
    accelerator = accelerator.replace("FOLDER", str(folder))
    data = yaml.safe_load(CUSTOM.read_text())
    data["accelerator"] = accelerator
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(data))
    line = one_line_error(_plan_with_system(str(path)))
    assert message.replace("FOLDER", str(folder)) in line, line


# --- -m ------------------------------------------------------------------------------------------

@pytest.mark.skipif(not Path("/dev/null").exists(), reason="no /dev/null")
def test_model_dev_null_is_not_a_regular_file():
    line = one_line_error(_invoke("plan", "-m", "/dev/null", "-s", "h100-sxm", "-g", "8", "-b", "64"))
    assert line.startswith("error: model: /dev/null is not a regular file"), line


def test_model_folder_with_no_config_json_says_so(tmp_path):
    """Guard (planner/hf_config.py gives this line): a folder for -m is a Hugging Face model folder;
    one without config.json is named as such, not as a missing file."""
    line = one_line_error(_invoke("plan", "-m", str(tmp_path), "-s", "h100-sxm", "-g", "8", "-b", "64"))
    assert str(tmp_path) in line and "no config.json" in line and "does not exist" not in line, line


def test_model_folder_message_when_resolution_reaches_it(tmp_path):
    """resolve_preset_or_file itself (reached for a model folder only if hf_config lets it through)."""
    with pytest.raises(SpecError, match=r"^model: .* is a folder with no config\.json; expected a Hugging Face"):
        resolve_preset_or_file(str(tmp_path), ROOT / "planner" / "presets", "model")


def test_empty_model_name():
    line = one_line_error(_invoke("plan", "-m", "", "-s", "h100-sxm", "-g", "8", "-b", "64"))
    assert "model: empty name: give a preset name or a path" in line, line


# --- saved plan files (read_yaml_mapping) ----------------------------------------------------------

@pytest.mark.skipif(not Path("/dev/null").exists(), reason="no /dev/null")
def test_plan_file_dev_null_is_not_a_regular_file():
    line = one_line_error(_invoke("estimate", "--plan", "/dev/null"))
    assert "plan /dev/null: is not a regular file" in line and "empty" not in line, line


@needs_fifo
def test_reading_a_fifo_is_refused_not_blocking(tmp_path):
    fifo = tmp_path / "plan.yaml"
    os.mkfifo(fifo)
    outcome: list = []

    def read():
        try:
            read_yaml_mapping(fifo, "plan")
        except SpecError as err:
            outcome.append(str(err))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # blocked opening the pipe: release it (a writer that closes at once)
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(5)
        pytest.fail("read_yaml_mapping blocked on a named pipe")
    assert outcome == [f"plan {fifo}: is not a regular file (a device, pipe or socket), expected a YAML file"]


# --- what still works -----------------------------------------------------------------------------

def test_presets_and_files_still_resolve(tmp_path, monkeypatch):
    """Guard: a preset name, a path to a YAML file, a symlink to one."""
    assert resolve_preset_or_file("h100-sxm", PRESET_DIR, "system") == (PRESET_DIR / "h100-sxm.yaml",
                                                                         "preset h100-sxm")
    assert load_system(str(CUSTOM)).num_gpus == 256
    link = tmp_path / "link.yaml"
    link.symlink_to(CUSTOM)
    assert load_system(str(link)).num_gpus == 256
    monkeypatch.chdir(tmp_path)
    Path("h100-sxm").mkdir()  # a folder named like a preset does not hide the preset
    assert load_system("h100-sxm").accelerator.name


# --- an unknown preset name suggests the one meant ------------------------------------------------

def _estimate(model: str = "llama3-8b", system: str = "h100-sxm"):
    return _invoke("estimate", "-m", model, "-s", system, "-g", "8", "--tp", "1", "--pp", "1", "-b", "8")


@pytest.mark.parametrize("ref, what, hint", [
    ("Llama-3-8B", "model", "(did you mean llama3-8b?)"),                  # case and separators
    ("lama3-8b", "model", "(did you mean llama3-8b?)"),                    # a typo, same numbers
    ("a100-80gb", "system", "(did you mean a100-80g?)"),
    ("GB200", "system", "(presets that begin so: gb200-nvl72)"),           # the start of a preset's name
    ("llama3.2", "model", "(presets that begin so: llama3.2-1b, llama3.2-3b)"),
    ("qwen3-coder", "model", "(presets that begin so: qwen3-coder-480b-a35b)"),  # listed as what it is
    ("qwen2.5-72B-Instruct", "model", "(did you mean qwen2.5-72b?)"),       # a repo's variant suffix
    ("Mistral-7B-v0.1", "model", "(did you mean mistral-7b?)"),
    ("DGX-B200", "system", "(did you mean b200?)"),                        # NVIDIA's server name for the GPU
    ("dgx-h100", "system", "(presets that begin so: h100-grand-teton, h100-offload-1tib, h100-sxm)"),
    ("DGX GB300", "system", "(presets that begin so: gb300-nvl72)"),
    ("dgx-2", "system", "(presets that begin so: dgx2-v100)"),             # the prefix kept where it names one
])
def test_unknown_preset_names_the_one_meant(ref, what, hint):
    result = _estimate(**{what: ref})
    assert result.exit_code == 2
    assert f"{what}: unknown preset {ref!r} {hint}; allowed:" in one_line_error(result)


@pytest.mark.parametrize("ref, what", [
    ("llama3-7b", "model"), ("deepseek-v4", "model"), ("gpt-oss-60b", "model"), ("nonsense-model", "model"),
    ("qwen3-2b", "model"),          # no Qwen3 2B: not qwen3-32b nor qwen3-235b-a22b
    ("nemotron-h-5", "model"),      # nor 5 the 56 of nemotron-h-56b
    ("deepseek-v2-mini", "model"),  # another variant's word, not a typo of deepseek-v2-lite
    ("h20", "system"), ("a10", "system"), ("h100-80g", "system"),  # other GPUs than h200, a100, a100-80g
    ("dgx-h20", "system"),  # a server of another GPU
])
def test_another_size_version_or_gpu_is_not_suggested(ref, what):
    """A name whose numbers or first letter differ from every preset's gets no guess."""
    result = _estimate(**{what: ref})
    assert result.exit_code == 2
    line = one_line_error(result)
    assert f"unknown preset {ref!r}; allowed:" in line and "did you mean" not in line


@pytest.mark.parametrize("ref, hint", [("./qwen3-32b", " (did you mean qwen3-32b?)"),
                                       ("nemotron-h-8b.yaml", " (did you mean nemotron-h-8b?)"),
                                       ("meta-llama/Llama-3.1-405B", " (did you mean llama3.1-405b?)"),
                                       ("../presets/llama3-8b", " (did you mean llama3-8b?)")])
def test_a_path_never_resolves_to_a_preset(ref, hint):
    """./NAME means the file NAME: missing, it is an error, not the preset of that name."""
    result = _estimate(model=ref)
    assert result.exit_code == 2
    assert f"model: file {ref} does not exist{hint}" in one_line_error(result)


@pytest.mark.parametrize("what", ["model", "system"])
def test_an_overlong_name_is_the_fields_error(what):
    result = _estimate(**{what: "a" * 300})
    assert result.exit_code == 2
    line = one_line_error(result)
    assert line.startswith(f"error: {what}: a name in 'aaaa") and "too long for the file system" in line
