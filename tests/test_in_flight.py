"""A checkpoint's record of the sampling in flight (engine/rollout/in_flight.py): written and
read back as it was, and read as a stranger's file: anything wrong in it is one line, never a
traceback. The exact resume it gives is in tests/test_rollout_pipeline.py."""

import json

import pytest
import torch
from safetensors.torch import save_file

from meds_cli.core.errors import UserError
from meds_cli.engine.rollout.in_flight import NOT_KEPT, jobs_file, read_in_flight, save_in_flight, weights_file
from meds_cli.engine.rollout.pipeline import InFlightJob, RolloutPipeline
from meds_cli.engine.rollout.sampling_engine import SampleRequest, SamplingSettings
from meds_cli.engine.rollout.training_processes import TrainingProcesses

TRAINED = {"layer.lora_A.weight": torch.Size([2, 3]), "layer.lora_B.weight": torch.Size([3, 2])}
# at a checkpoint after step 2 with k = 2: step 3 sampled from version 0, step 4 from version 1
JOBS = [InFlightJob(3, 0, (SampleRequest((5, 6), (11, 2**61)), SampleRequest((7,), (13, 14)))),
        InFlightJob(4, 1, (SampleRequest((8, 9), (15, 16)),))]


def weights_of(version: int) -> dict:
    return {name: torch.full(shape, float(version)) for name, shape in TRAINED.items()}


def read(folder, step: int = 2):
    return read_in_flight(folder, 0, step=step, trained=TRAINED, vocab_size=53)


def test_what_is_written_is_read_back(tmp_path):
    save_in_flight(tmp_path, 0, JOBS, {0: weights_of(0), 1: weights_of(1)})
    jobs, weights = read(tmp_path)
    assert jobs == JOBS and sorted(weights) == [0, 1]
    assert all(torch.equal(weights[v][n], weights_of(v)[n]) for v in (0, 1) for n in TRAINED)
    assert read_in_flight(tmp_path, 1, step=2, trained=TRAINED, vocab_size=53) is None  # nothing of process 1


def test_full_weights_record_the_jobs_and_say_the_weights_were_not_kept(tmp_path):
    save_in_flight(tmp_path, 0, JOBS[:1], None)
    assert json.loads(jobs_file(tmp_path, 0).read_text())["weights"] == NOT_KEPT
    assert read(tmp_path) == (JOBS[:1], None) and not list(tmp_path.glob("*.safetensors"))


def edit(record: dict, change) -> dict:
    change(record)
    return record


@pytest.mark.parametrize("text, says", [
    ("{not json", "is not valid JSON"),
    (json.dumps([1, 2]), "not a JSON object"),
    (json.dumps({"format": "other", "version": 1, "jobs": []}), "is not a meds-in-flight file"),
    (json.dumps({"format": "meds-in-flight", "version": 1, "jobs": "all"}), "has no list of jobs"),
])
def test_a_file_that_is_not_a_record_is_one_line(tmp_path, text, says):
    jobs_file(tmp_path, 0).write_text(text)
    with pytest.raises(UserError) as error:
        read(tmp_path)
    assert says in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("change, says", [
    (lambda r: r["jobs"][0].update(step=2), "a job for step 2, not one after step 2"),
    (lambda r: r["jobs"][0].update(step=True), "a job for step True"),
    (lambda r: r["jobs"][0].update(policy_version=2), "policy version 2, not one of 0..1"),
    (lambda r: r["jobs"][0].update(policy_version="1"), "policy version '1'"),
    (lambda r: r["jobs"][0]["requests"][0].update(prompt_ids=[5, 99]), "token ids below 53"),
    (lambda r: r["jobs"][0]["requests"][0].update(seeds=[-1]), "seeds are not a list of integers"),
    (lambda r: r["jobs"][0]["requests"][0].update(seeds=[2**62]), "seeds are not a list of integers"),
    (lambda r: r["jobs"][0]["requests"][0].update(seeds=[]), "seeds are not a list of integers"),
    (lambda r: r["jobs"][0].update(requests={"a": 1}), "without a list of requests"),
    (lambda r: r["jobs"].append("job"), "a job that is not an object"),
    (lambda r: r.update(note="x"), "has key 'note' in the record, which the format does not have"),
    (lambda r: r["jobs"][0].update(trained=True), "has key 'trained' in a job"),
    (lambda r: r["jobs"][0]["requests"][0].update(logprobs=[]), "has key 'logprobs' in a request"),
    (lambda r: r["jobs"].append(dict(r["jobs"][0])), "has two jobs for step 3"),
    (lambda r: r["jobs"][0]["requests"][1].update(seeds=[13, 11]), "a job for step 3 with seed 11 twice"),
    (lambda r: r["jobs"][0]["requests"][0].update(seeds=[11, 11]), "a job for step 3 with seed 11 twice"),
    (lambda r: r.update(weights="maybe"), "says weights 'maybe', not 'saved' or 'not saved: ...'"),
])
def test_a_bad_job_is_one_line(tmp_path, change, says):
    save_in_flight(tmp_path, 0, JOBS[:1], {0: weights_of(0)})
    record = json.loads(jobs_file(tmp_path, 0).read_text())
    jobs_file(tmp_path, 0).write_text(json.dumps(edit(record, change)))
    with pytest.raises(UserError) as error:
        read(tmp_path)
    assert says in str(error.value) and "\n" not in str(error.value), str(error.value)


@pytest.mark.parametrize("tensors, says", [
    (None, "is missing"),
    ({"layer.lora_A.weight": torch.zeros(2, 3)}, "does not hold this model's trained weights"),
    ({**weights_of(1), "layer.lora_B.weight": torch.zeros(2, 2)}, "in another shape or type"),
    ({**weights_of(1), "layer.lora_B.weight": torch.zeros(3, 2, dtype=torch.long)}, "in another shape or type"),
    ("not safetensors", "not a valid safetensors file"),
    ({**weights_of(0), "layer.lora_B.weight": torch.full((3, 2), float("nan"))}, "values that are not finite"),
    ({**weights_of(0), "layer.lora_A.weight": torch.full((2, 3), float("inf"))}, "values that are not finite"),
])
def test_bad_weights_of_a_version_are_one_line(tmp_path, tensors, says):
    save_in_flight(tmp_path, 0, JOBS[:1], {0: weights_of(0)})
    path = weights_file(tmp_path, 0)
    if tensors is None:
        path.unlink()
    elif isinstance(tensors, str):
        path.write_text(tensors)
    else:
        save_file(tensors, str(path))
    with pytest.raises(UserError) as error:
        read(tmp_path)
    assert says in str(error.value) and "\n" not in str(error.value), str(error.value)


def test_records_that_differ_between_processes_are_refused_before_anything_is_sent():
    class Unused:
        name, starts_with_policy, keeps_versions = "unused", True, True

        def submit(self, *args):
            raise AssertionError("nothing may be sent")

    # the other process holds one job more: its minimum of -count is lower
    lined_up = TrainingProcesses(0, 2, min=lambda value: value - 1 if value < 0 else value)
    pipeline = RolloutPipeline(Unused(), 1, processes=lined_up)
    with pytest.raises(UserError, match="differ between processes"):
        pipeline.resubmit(JOBS[:1], {0: weights_of(0)}, SamplingSettings(1.0, 1.0, 2, (0,)))


def test_a_job_whose_prompts_or_seeds_are_not_those_its_step_draws_is_refused(tmp_path):
    save_in_flight(tmp_path, 0, JOBS, {0: weights_of(0), 1: weights_of(1)})
    plan = {job.step: job.requests for job in JOBS}
    assert read_in_flight(tmp_path, 0, step=2, trained=TRAINED, vocab_size=53, planned=plan.get)[0] == JOBS
    for other in ((SampleRequest((8, 9), (15, 17)),), (SampleRequest((8, 10), (15, 16)),), ()):
        plan[4] = other
        with pytest.raises(UserError) as error:
            read_in_flight(tmp_path, 0, step=2, trained=TRAINED, vocab_size=53, planned=plan.get)
        assert "a job for step 4 whose prompts or seeds are not those step 4 draws" in str(error.value)
