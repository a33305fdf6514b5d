"""`planner validate --reference FILE` refuses a malformed record in one line (exit 2, the record's
id and the field named, no traceback): a fuzzer copied one record of measured_runs.yaml into a file
of the same top-level structure and changed one field at a time, and these were read before."""
import copy

import pytest
import yaml
from typer.testing import CliRunner

from hardware.errors import SpecError
from planner.cli import app
from planner.reference import REFERENCE_DIR, load_reference
from tests.conftest import SHARED_REFERENCE_DIR, one_line_error, reference_yaml

runner = CliRunner()

SOURCE = (SHARED_REFERENCE_DIR if SHARED_REFERENCE_DIR.exists() else REFERENCE_DIR) / "measured_runs.yaml"
# compared today from its measured step time; it also prints TFLOP/s, gelu, full recompute
RID = "megatron_readme_2020_1B_dgxa100"
# compared today from the step time its source derived from TFLOP/s
TFLOPS_RID = "megatron_readme_h100_weak_1.7B"


def _record(rid: str = RID) -> dict:
    return copy.deepcopy(next(r for r in reference_yaml(SOURCE)["records"] if r["id"] == rid))


def _write(path, records: list, **top) -> str:
    """A file with measured_runs.yaml's top-level structure holding `records`."""
    doc = {k: v for k, v in reference_yaml(SOURCE).items() if k != "records"}
    doc.update(top)
    doc["records"] = records
    doc["record_count"] = len(records)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(path)


def _mutated(tmp_path, section: str | None, field: str, value, rid: str = RID) -> str:
    rec = _record(rid)
    (rec if section is None else rec[section])[field] = value
    return _write(tmp_path / "one.yaml", [rec])


def _validate(*paths: str):
    args = ["validate", "--summary"]
    for p in paths:
        args += ["--reference", p]
    return runner.invoke(app, args)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 0, -1.5], ids=str)
def test_step_time_must_be_finite_and_positive(tmp_path, value):
    path = _mutated(tmp_path, "measured", "iteration_time_s", value)
    one_line_error(_validate(path), RID, "measured.iteration_time_s", "finite number > 0")
    with pytest.raises(SpecError, match=rf"reference {RID}: measured\.iteration_time_s"):
        load_reference(path)


@pytest.mark.parametrize("value", [-5, 0, float("nan")], ids=str)
def test_a_bad_tflops_is_malformed_even_where_the_step_time_is_used(tmp_path, value):
    one_line_error(_validate(_mutated(tmp_path, "measured", "tflops_per_gpu", value)), RID,
                   "measured.tflops_per_gpu")


def test_a_negative_tflops_is_malformed_not_missing(tmp_path):
    # its only measurement: was "skipped: no step time or throughput to compare"
    rec = _record(TFLOPS_RID)
    del rec["derived"]
    rec["measured"]["tflops_per_gpu"] = -5
    result = _validate(_write(tmp_path / "one.yaml", [rec]))
    one_line_error(result, TFLOPS_RID, "measured.tflops_per_gpu", "-5")
    assert "skipped" not in result.output


def test_a_nonfinite_derived_step_time_is_refused(tmp_path):
    rec = _record(TFLOPS_RID)
    rec["derived"]["iteration_time_s"] = float("inf")
    one_line_error(_validate(_write(tmp_path / "one.yaml", [rec])), TFLOPS_RID, "derived.iteration_time_s")


@pytest.mark.parametrize("value,words", [(1e300, "step time of 0 s"), (1e30, "above the A100")], ids=str)
def test_a_throughput_no_gpu_runs_at_is_refused(tmp_path, value, words):
    """A TFLOP/s of 1e300 gives a step time of 0 (it was a ZeroDivisionError), one of 1e30 a rate
    above the GPU's peak: both are unit slips, refused by name."""
    rid = "narayanan2021_t1_1.7B"  # its step time is derived from its TFLOP/s (eq. 3)
    rec = _record(rid)
    del rec["derived"]
    rec["measured"]["tflops_per_gpu"] = value
    one_line_error(_validate(_write(tmp_path / "one.yaml", [rec])), rid, words, "units")


@pytest.mark.parametrize("vpp", [27, 10**8])  # 24 layers, pp 1: at most 26
def test_a_vpp_beyond_the_layers_is_refused_at_once(tmp_path, vpp):
    """vpp 1e8 built a layout of 1e8 virtual stages (validate hung); one more than a layer, the
    embedding or the loss per virtual stage is refused as the --vpp flag is."""
    one_line_error(_validate(_mutated(tmp_path, "parallel", "vpp", vpp)), RID, "parallel.vpp", "from 1 to")


def test_a_nonfinite_fsdp_throughput_is_refused(tmp_path):
    fsdp = (SOURCE.parent / "fsdp_moe_runs.yaml")
    doc = copy.deepcopy(reference_yaml(fsdp))
    rid = "torchtitan_llama3-8b_8gpu_fsdp8"
    rec = next(r for r in doc["records"] if r["id"] == rid)
    rec["measured"]["tokens_per_sec_per_gpu"] = float("nan")
    doc["records"] = [rec]
    path = tmp_path / "fsdp.yaml"
    path.write_text(yaml.safe_dump(doc))
    one_line_error(_validate(str(path)), rid, "measured.tokens_per_sec_per_gpu")


@pytest.mark.parametrize("value", ["bogus", "partial", "nonsense words"], ids=str)
def test_unknown_recompute_is_refused_with_the_allowed_values(tmp_path, value):
    one_line_error(_validate(_mutated(tmp_path, "parallel", "recompute", value)), RID, "parallel.recompute",
                   "full", "selective", "none")


@pytest.mark.parametrize("value", ["selective", "none", "norm, act", "full (assumed)", False])
def test_the_recompute_values_records_use_still_read(tmp_path, value):
    # the guard beside the refusal above: each spelling the packaged files use is read as before
    path = _mutated(tmp_path, "parallel", "recompute", value)
    result = _validate(path)
    assert result.exit_code == 0, result.output
    (case,), _ = load_reference(path)
    assert case.plan.recompute == ("none" if value in ("none", False) else
                                   "full" if str(value).startswith("full") else "selective")
    # and an unknown value fails where these pass (was read as selective with an assumption)
    with pytest.raises(SpecError, match=rf"reference {RID}: parallel\.recompute: unknown recompute 'bogus'"):
        load_reference(_mutated(tmp_path, "parallel", "recompute", "bogus"))


@pytest.mark.parametrize("value", ["tanh", "sigmoid", "gelus", "silux"])
def test_unknown_activation_is_refused_with_the_allowed_ones(tmp_path, value):
    one_line_error(_validate(_mutated(tmp_path, "model", "activation", value)), RID, "model.activation",
                   "gelu, swiglu, squared_relu")


@pytest.mark.parametrize("value", [None, "", "  ", 5])
def test_a_record_needs_a_non_empty_string_id(tmp_path, value):
    result = _validate(_mutated(tmp_path, None, "id", value))
    one_line_error(result, "one.yaml record 1", "id:", "non-empty string")


def test_a_record_without_an_id_is_refused(tmp_path):
    rec = _record()
    del rec["id"]
    one_line_error(_validate(_write(tmp_path / "one.yaml", [rec])), "one.yaml record 1", "id:")


def test_duplicate_ids_in_one_file_are_refused(tmp_path):
    # the record alone, the baseline every mutation in this file starts from: read and compared
    result = _validate(_write(tmp_path / "one.yaml", [_record()]))
    assert result.exit_code == 0 and "read 1 records: 1 compared, 0 skipped" in result.output, result.output
    path = _write(tmp_path / "two.yaml", [_record(), _record()])
    one_line_error(_validate(path), RID, "id:", "duplicate", "records 1 and 2")


def test_duplicate_ids_across_files_are_refused(tmp_path):
    a = _write(tmp_path / "a.yaml", [_record()])
    b = _write(tmp_path / "b.yaml", [_record(), _record(TFLOPS_RID)])
    one_line_error(_validate(a, b), RID, "id:", "duplicate", "a.yaml", "b.yaml")


def test_the_same_file_twice_is_refused(tmp_path):
    a = _write(tmp_path / "a.yaml", [_record()])
    one_line_error(_validate(a, a), "a.yaml", "given twice")
    # also under another spelling of the same path
    one_line_error(_validate(a, str(tmp_path / "." / "a.yaml")), "a.yaml", "given twice")


@pytest.mark.parametrize("version", [0, "two", 1.5, True])
def test_a_schema_version_that_is_no_version_is_refused(tmp_path, version):
    one_line_error(_validate(_write(tmp_path / "one.yaml", [_record()], schema_version=version)),
                   "one.yaml", "schema_version", "an integer >= 1")


def test_a_later_schema_version_is_read_by_field_names(tmp_path):
    """Newer data is not shut out whole: its records are read (or refused) field by field."""
    assert _validate(_write(tmp_path / "one.yaml", [_record()], schema_version=2)).exit_code == 0
    assert _validate(_write(tmp_path / "one.yaml", [_record()], schema_version=1)).exit_code == 0
    (tmp_path / "bare.yaml").write_text(yaml.safe_dump({"records": [_record()]}))  # no version stated
    assert _validate(str(tmp_path / "bare.yaml")).exit_code == 0


def test_no_comparable_record_is_an_input_error():
    from planner.reference import Skipped, require_compared
    with pytest.raises(SpecError, match=r"^reference: no record could be compared \(1 read, all skipped; "
                                        r"the first, r1: parallel layout \(tp/pp\) not published\)$"):
        require_compared([], [Skipped("r1", "parallel layout (tp/pp) not published")])
    require_compared(load_reference(REFERENCE_DIR / "bridge_runs.yaml")[0], [])  # cases: nothing to say


def test_validate_with_every_record_skipped_says_so(tmp_path):
    rec = _record()
    rec["parallel"]["tp"] = None  # skipped: parallel layout (tp/pp) not published
    result = _validate(_write(tmp_path / "one.yaml", [rec]))
    one_line_error(result, "no record could be compared", RID, "not published")
    assert "nan" not in result.output


@pytest.mark.parametrize("value", [True, "yes"])
def test_recompute_true_is_megatrons_recompute_activations(tmp_path, value):
    """`recompute: true` (Megatron's --recompute-activations) is selective recompute, said as an assumption."""
    cases, skipped = load_reference(_mutated(tmp_path, "parallel", "recompute", value))
    assert not skipped and cases[0].plan.recompute == "selective"
    assert any("--recompute-activations" in a for a in cases[0].assumptions)


@pytest.mark.parametrize(("value", "activation"), [("silu", "swiglu"), ("SwiGLU", "swiglu"), ("geglu", "swiglu"),
                                                   ("relu", "gelu"), ("relu^2", "squared_relu"), ("ReLU²", "squared_relu"),
                                                   ("gelu (GeGLU in original)", "gelu"), ("gelu_new", "gelu"),
                                                   ("gelu_pytorch_tanh", "gelu"), ("Swish-GLU", "swiglu"),
                                                   ("gated-silu", "swiglu")])
def test_activation_synonyms_are_read(tmp_path, value, activation):
    cases, _ = load_reference(_mutated(tmp_path, "model", "activation", value))
    assert cases[0].model.activation == activation


@pytest.mark.parametrize("value", ["none (assumed)", "no recompute", "off", "False"])
def test_no_recompute_may_carry_a_note(tmp_path, value):
    cases, _ = load_reference(_mutated(tmp_path, "parallel", "recompute", value))
    assert cases[0].plan.recompute == "none"


@pytest.mark.parametrize("name", ["", "  "])
def test_an_empty_reference_name_is_named_as_such(name):
    """--reference '' had said 'reference .: is a folder' (Path('') is the current folder)."""
    one_line_error(_validate(name), "reference: empty name")


@pytest.mark.parametrize("section,field", [("parallel", "tp"), ("parallel", "global_batch"), ("model", "layers"),
                                           ("system", "gpus")])
@pytest.mark.parametrize("value", [float("inf"), -float("inf"), float("nan"), 1e308], ids=str)
def test_an_integer_field_that_is_not_a_finite_count_is_refused_by_name(tmp_path, section, field, value):
    """(2026-11-28, tenth session: an infinity was an internal error, exit 70; a NaN named
    neither record nor field; 1e308 overflowed a float later.)"""
    one_line_error(_validate(_mutated(tmp_path, section, field, value)), RID, f"{section}.{field}",
                   "expected an integer from")
