"""A fourteenth pass over malformed input (an independent audit of user files, saved plans, flag
combinations and the Python API): a hand-edited plan file's batch beyond the --global-batch cap was
costed and launched, the Python API's estimate and pins fell into an AttributeError or a
ZeroDivisionError, a compute capability written in its sm_XY form (90) passed as 90.0 and let an
H100 launch MXFP8, and a few messages kept pydantic's words or lacked the near field name."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from planner.cli.app import app
from tests.conftest import one_line_error

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


def run(args: list[str]):
    return runner.invoke(app, args)


def test_a_plan_files_batch_beyond_the_flags_cap_is_refused(tmp_path, llama3_8b_plan_file_text):
    """`-b 1000000000000` is refused (the cap is 2^20 sequences), but the same batch written into a
    saved plan file was costed (31,250,000,000 microbatches) and launched by `planner megatron`."""
    doc = yaml.safe_load(llama3_8b_plan_file_text)
    batch = doc["plan"]["micro_batch"] * doc["plan"]["dp"] * 2 ** 21
    doc["plan"]["global_batch"] = doc["global_batch"] = batch
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    for args in (["estimate", "--plan", str(path)], ["megatron", "--plan", str(path)],
                 ["plan", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--versus", str(path)]):
        one_line_error(run(args), "global_batch: must be an integer from 1 to 1,048,576", f"{batch:,}")


def test_the_python_apis_missing_plan_and_zero_tp_pin_are_input_errors():
    """`estimate(model, system, None, job)` raised AttributeError ('NoneType' object has no
    attribute 'global_batch') where a dict there is a one-line SpecError; a pin of tp 0 raised
    ZeroDivisionError inside the NVLink hint, where pp 0 or cp 0 are 'not a legal value here'."""
    from hardware.errors import SpecError
    from planner import JobSpec, check, count, estimate, load_model, load_system, plan
    model, system = load_model("llama3-8b"), load_system("h100-sxm", 64)
    with pytest.raises(SpecError, match=r"^plan: expected a Plan \(e\.g\. Plan\(.*got NoneType"):
        estimate(model, system, None, JobSpec(global_batch=512))
    for search in (plan, check, count):
        with pytest.raises(SpecError, match=r"^pin tp: 0 is not a legal value here; allowed: 1, 2, 4, 8$"):
            search(model, system, JobSpec(global_batch=512, pins={"tp": 0}))


def _system_with_accelerator(tmp_path, filename: str, **accelerator) -> str:
    base = yaml.safe_load((ROOT / "hardware/presets/h100-sxm.yaml").read_text())
    acc = yaml.safe_load((ROOT / "hardware/presets/accelerators/h100-sxm5-80gb.yaml").read_text())
    path = tmp_path / filename
    path.write_text(yaml.safe_dump({**base, "name": "custom", "num_gpus": 16, "accelerator": {**acc, **accelerator}}))
    return str(path)


def test_a_compute_capability_in_its_sm_form_is_refused_with_the_dotted_form(tmp_path):
    """`compute_capability: 90` (nvcc's sm_90) was read as 90.0, inside the 1-99 range, so an H100
    passed every architecture check: `--dtype mxfp8` was costed and launched with --fp8-recipe
    mxfp8, which the same file with 9.0 refuses (MXFP8 needs 10.0)."""
    sm = _system_with_accelerator(tmp_path, "sm.yaml", compute_capability=90,
                                  peak_flops={"bf16": 989.4e12, "fp8": 1978.9e12, "mxfp8": 1978.9e12})
    for command in ("estimate", "megatron"):
        one_line_error(run([command, "-m", "llama3-8b", "-s", sm, "-b", "64", "--tp", "2", "--dtype", "mxfp8"]),
                       "compute_capability: must be major.minor", "got 90", "sm_90 is written 9.0")
    dotted = _system_with_accelerator(tmp_path, "dotted.yaml", compute_capability=12.1)
    assert run(["count", "-m", "llama3-8b", "-s", dotted, "-b", "64"]).exit_code == 0  # the newest real one reads


def test_a_misspelt_optional_field_is_named_with_the_field_it_resembles(tmp_path):
    """'did you mean' came only for a misspelt required field (pydantic also reports it missing):
    `biasses:` in a model file, `hbm_eficiency:` in an accelerator's efficiency block or `micro_bach:`
    in a plan file, whose fields have defaults, were a bare 'unknown field'."""
    model = yaml.safe_load((ROOT / "planner/presets/llama3-8b.yaml").read_text())
    model["biasses"] = model.pop("biases")
    (tmp_path / "m.yaml").write_text(yaml.safe_dump({**model, "name": "mine"}))
    one_line_error(run(["check", "-m", str(tmp_path / "m.yaml"), "-s", "h100-sxm", "-g", "8", "-b", "8"]),
                   "model (", "biasses: unknown field (did you mean biases?)")
    acc = yaml.safe_load((ROOT / "hardware/presets/accelerators/h100-sxm5-80gb.yaml").read_text())
    efficiency = dict(acc["efficiency"])
    efficiency["hbm_eficiency"] = efficiency.pop("hbm_efficiency")
    system = _system_with_accelerator(tmp_path, "s.yaml", efficiency=efficiency)
    one_line_error(run(["count", "-m", "llama3-8b", "-s", system, "-b", "64"]),
                   "accelerator.efficiency.hbm_eficiency: unknown field (did you mean hbm_efficiency?)")
    plan = tmp_path / "p.yaml"
    plan.write_text(yaml.safe_dump({"tp": 1, "pp": 1, "dp": 8, "global_batch": 8, "micro_bach": 1}))
    one_line_error(run(["estimate", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "--plan", str(plan)]),
                   "micro_bach: unknown field (did you mean micro_batch?)")
    one_line_error(run(["count", "-m", "llama3-8b", "-s", _system_with_accelerator(tmp_path, "z.yaml", zz=1), "-b", "64"]),
                   "accelerator.zz: unknown field")  # nothing near: no guess


def test_a_misspelt_field_of_a_saved_plan_is_not_said_to_be_a_file_cut_short(tmp_path, llama3_8b_plan_file_text):
    """A saved plan with `sequence_paralel:` (or `flash_atention:`, a bytes_per_param `weight:`) was
    refused as 'missing plan.sequence_parallel: ... (was it cut short?)': the key the user wrote went
    unnamed. The typo is named, with the field it resembles; a field really missing still reads so."""
    for name, edit, words in (
            ("sp.yaml", lambda d: d["plan"].__setitem__("sequence_paralel", d["plan"].pop("sequence_parallel")),
             "plan.sequence_paralel: unknown field (did you mean sequence_parallel?)"),
            ("fa.yaml", lambda d: d["job"].__setitem__("flash_atention", d["job"].pop("flash_attention")),
             "job.flash_atention: unknown field (did you mean flash_attention?)"),
            ("w.yaml", lambda d: d["job"]["bytes_per_param"].__setitem__("weight", d["job"]["bytes_per_param"].pop("weights")),
             "job.bytes_per_param.weight: unknown field (did you mean weights?)"),
            ("cut.yaml", lambda d: d["plan"].pop("sequence_parallel"), "missing plan.sequence_parallel")):
        doc = yaml.safe_load(llama3_8b_plan_file_text)
        edit(doc)
        (tmp_path / name).write_text(yaml.safe_dump(doc, sort_keys=False))
        line = one_line_error(run(["estimate", "--plan", str(tmp_path / name)]), words)
        assert ("cut short" in line) == (name == "cut.yaml"), line


def test_pydantic_wording_of_an_empty_name_and_a_mapping_key_is_said_in_the_projects_words(tmp_path):
    """`name: ''` said pydantic's 'String should have at least 1 character'; a misspelt dtype key
    of peak_flops (or of a plan file's module_dtypes) said 'peak_flops.bfl6.[key]: must be ...'."""
    line = one_line_error(run(["count", "-m", "llama3-8b", "-s", _system_with_accelerator(tmp_path, "n.yaml", name=""),
                               "-b", "64"]), "accelerator.name: must be at least 1 character(s) long, got the text ''")
    assert "String should" not in line
    peaks = {"fp32": 66.9e12, "bfl6": 989.4e12, "fp16": 989.4e12}
    line = one_line_error(run(["count", "-m", "llama3-8b", "-s", _system_with_accelerator(tmp_path, "k.yaml", peak_flops=peaks),
                               "-b", "64"]),
                          "accelerator.peak_flops: unknown key 'bfl6' (did you mean bf16?); allowed: fp32, tf32, fp16, bf16")
    assert "[key]" not in line


def test_a_model_folders_config_json_that_is_a_folder_or_a_broken_link_is_said_so(tmp_path):
    """A model folder whose config.json is a folder, or a link to nowhere (a loop), was said to hold
    no config.json; `-m folder/config.json` naming a folder was 'not a regular file (a device, pipe
    or socket)'. Each is now said as it is."""
    (tmp_path / "a" / "config.json").mkdir(parents=True)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "config.json").symlink_to("config.json")  # a loop of one link
    base = ["-s", "h100-sxm", "-g", "8", "-b", "8"]
    one_line_error(run(["check", "-m", str(tmp_path / "a"), *base]), "a/config.json is a folder, expected the config.json")
    one_line_error(run(["check", "-m", str(tmp_path / "a" / "config.json"), *base]),
                   "a/config.json: is a folder, expected a config.json file")
    one_line_error(run(["check", "-m", str(tmp_path / "b"), *base]),
                   "b/config.json is a symbolic link that leads to no file")


def test_a_lower_case_hybrid_pattern_names_each_character_and_the_case(tmp_path):
    """`hybrid_pattern: memem...` said "'em' is not a block", the bad characters run together
    into a word no pattern holds; each is named apart, and that blocks are upper case."""
    model = yaml.safe_load((ROOT / "planner/presets/nemotron-3-nano.yaml").read_text())
    model.update(name="mine", hybrid_pattern=model["hybrid_pattern"].lower())
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(model))
    one_line_error(run(["check", "-m", str(tmp_path / "m.yaml"), "-s", "h100-sxm", "-g", "8", "-b", "8"]),
                   "hybrid_pattern: 'e', 'm' are not blocks (blocks are upper case); allowed: M (Mamba-2 mixer)")


def test_the_python_apis_free_batch_cap_is_the_flags():
    """`--max-global-batch` stops at 2^20, but JobSpec(max_global_batch=2**40) reached the search,
    whose free-batch domain holds every batch up to the cap: plan, check and count ended in a
    MemoryError. It is refused where it is made; a fixed batch of any size still searches."""
    from pydantic import ValidationError

    from planner import JobSpec, load_model, load_system, plan
    with pytest.raises(ValidationError, match="max_global_batch: must be an integer from 1 to 1,048,576 where the batch is free"):
        JobSpec(max_global_batch=2 ** 40)
    assert JobSpec(max_global_batch=2 ** 20).max_global_batch == 2 ** 20
    result = plan(load_model("llama3-8b"), load_system("h100-sxm", 64), JobSpec(global_batch=2 ** 40), top_k=1)
    assert result.best.plan.global_batch == 2 ** 40


@pytest.mark.parametrize(("flag", "value", "words"), [
    ("-g", "8.5", "'8.5' is not an integer (e.g. 1024)"), ("-g", "1e3", "'1e3' is not an integer"),
    ("--top", "x", "'x' is not an integer"), ("--hbm-reserve-gib", "2,5", "'2,5' is not a number (e.g. 1.5)")])
def test_a_number_flag_that_does_not_parse_says_what_was_written(flag, value, words):
    """typer's conversion said pydantic's words for every such value ('Input should be a valid
    integer, unable to parse string as an integer'), not what was written or what is wanted."""
    line = one_line_error(run(["plan", "-m", "llama3-8b", "-s", "h100-sxm", "-b", "8", flag, value]), words)
    assert "Input should be" not in line and "unable to parse" not in line


def test_the_python_apis_search_time_limit_is_checked():
    """`plan(..., time_limit_s='5')` ended in OR-Tools' TypeError ('incompatible function
    arguments'), and NaN, inf, 0 or -1 were handed to CP-SAT unchecked; `planner sweep --time-limit`
    refuses them. A tiny positive limit stays allowed (the table-order fallback's test uses 1e-6)."""
    from hardware.errors import SpecError
    from planner import JobSpec, load_model, load_system, plan
    model, system, job = load_model("llama3-8b"), load_system("h100-sxm", 64), JobSpec(global_batch=512)
    for bad in ("5", float("nan"), float("inf"), 0, -1, True, 86401):
        with pytest.raises(SpecError, match=r"^time_limit_s: must be a number of seconds > 0 and at most 86,400"):
            plan(model, system, job, top_k=1, time_limit_s=bad)


def test_a_field_name_that_is_not_text_in_the_python_api_is_said_in_the_projects_words():
    """load_model(ref, {1: 2}) said pydantic's 'Keys should be strings' (a YAML file's number key is
    refused on reading, with its own message)."""
    from hardware.errors import SpecError
    from planner import load_model
    with pytest.raises(SpecError, match=r"^model \(preset llama3-8b\): 1: a field name must be text, got the number 1$"):
        load_model("llama3-8b", {1: 2})


def test_a_list_longer_than_its_field_takes_is_said_in_the_projects_words(tmp_path, llama3_8b_plan_file_text):
    """A saved plan's `bf16_layers: [0, 0, 0]` said pydantic's 'Tuple should have at most 2 items
    after validation, not 3'."""
    doc = yaml.safe_load(llama3_8b_plan_file_text)
    doc["job"]["bf16_layers"] = [0, 0, 0]
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    line = one_line_error(run(["estimate", "--plan", str(tmp_path / "p.yaml")]),
                          "job: bf16_layers: expected at most 2 item(s), got 3")
    assert "Tuple" not in line


def test_a_plan_files_recompute_as_a_list_is_an_input_error_not_an_internal_one(tmp_path, llama3_8b_plan_file_text):
    """`recompute: []` (or a mapping) in a plan file reached `recompute not in RECOMPUTE_CODES` with an
    unhashable value: 'internal error (TypeError: unhashable type: list)', exit 70."""
    for value in ([], ["full"], {"a": 1}):
        doc = yaml.safe_load(llama3_8b_plan_file_text)
        doc["plan"]["recompute"] = value
        (tmp_path / "p.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        one_line_error(run(["estimate", "--plan", str(tmp_path / "p.yaml")]),
                       "recompute: must be 'none', 'selective' or 'full', got")


def test_a_yes_no_field_left_empty_is_said_in_the_projects_words(tmp_path, llama3_8b_plan_file_text):
    """`biases:` or a plan file's `flash_attention:` left empty (YAML null) said pydantic's 'Input
    should be a valid boolean'."""
    model = yaml.safe_load((ROOT / "planner/presets/llama3-8b.yaml").read_text())
    (tmp_path / "m.yaml").write_text(yaml.safe_dump({**model, "name": "mine", "biases": None}))
    line = one_line_error(run(["check", "-m", str(tmp_path / "m.yaml"), "-s", "h100-sxm", "-g", "8", "-b", "8"]),
                          "biases: expected true or false, got null")
    assert "Input should" not in line
    doc = yaml.safe_load(llama3_8b_plan_file_text)
    doc["job"]["flash_attention"] = None
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    one_line_error(run(["estimate", "--plan", str(tmp_path / "p.yaml")]), "job: flash_attention: expected true or false, got null")


def test_checkpoint_refuses_adam_moments_beside_a_weights_only_checkpoint():
    """`planner checkpoint --weights-only --adam-moments bf16` printed the weights-only checkpoint
    unchanged: a setting that changes nothing is refused (as --max-global-batch beside a fixed
    batch), not dropped in silence."""
    one_line_error(run(["checkpoint", "-m", "llama3-8b", "-g", "64", "--weights-only", "--adam-moments", "bf16"]),
                   "adam-moments:", "--weights-only checkpoint holds no optimizer state", "drop one of the two")
    assert run(["checkpoint", "-m", "llama3-8b", "-g", "64", "--adam-moments", "bf16"]).exit_code == 0


def test_a_reference_file_that_is_a_link_to_nowhere_is_said_so(tmp_path):
    """`validate --reference loop.yaml` (a loop of links, or one to a deleted file) said the file was
    'not found', though it is there: as -m and -s say, it is a link that leads to no file."""
    (tmp_path / "a.yaml").symlink_to(tmp_path / "b.yaml")
    (tmp_path / "b.yaml").symlink_to(tmp_path / "a.yaml")
    one_line_error(run(["validate", "--reference", str(tmp_path / "a.yaml")]),
                   "a.yaml is a symbolic link that leads to no file")


@pytest.mark.skipif(not __import__("shutil").which("planner") or __import__("sys").platform != "linux",
                    reason="needs the installed command")
@pytest.mark.parametrize("command", [["plan"], ["estimate", "--tp", "2"]])
def test_a_reader_that_leaves_early_does_not_lose_the_saved_plan(tmp_path, command):
    """`planner plan ... --save plan.yaml | head -1` ended with exit 141 and no plan.yaml: the file
    was written after the output, whose first closed write stopped the command. It is written
    first; the exit is still 141."""
    import shutil
    import subprocess

    from planner.cli.app import EXIT_PIPE_CLOSED
    saved = tmp_path / "plan.yaml"
    proc = subprocess.Popen([shutil.which("planner"), *command, "-m", "llama3-8b", "-s", "h100-sxm", "-g", "64",
                             "-b", "512", "--save", str(saved)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=300) in (EXIT_PIPE_CLOSED, 0), err  # 0 only where all of it fit the pipe first
    assert run(["estimate", "--plan", str(saved)]).exit_code == 0


def test_a_layout_string_with_a_trailing_newline_reads_as_without_it():
    """`--pipeline-layout $'Et*8|t*8|t*8|t*8L\\n'` (pasted with its line end) was refused as "the loss
    'L' must come once, last in the last stage (got 'Et*8|t*8|t*8|t*8L')": the counts were read from
    the stripped text, Megatron's check from the raw one, and the message showed the stripped one."""
    base = ["-m", "llama3-8b", "-s", "h100-sxm", "-g", "64", "-b", "512", "--pp", "4"]
    plain = run(["estimate", *base, "--pipeline-layout", "Et*8|t*8|t*8|t*8L", "--json"])
    pasted = run(["estimate", *base, "--pipeline-layout", "Et*8|t*8|t*8|t*8L\n", "--json"])
    assert pasted.exit_code == plain.exit_code == 0, pasted.output
    assert pasted.stdout == plain.stdout
