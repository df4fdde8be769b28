"""Prompt sources: files, local HF datasets, reasoning-gym; deterministic and resumable by index."""

import json

import pytest

from flashq.config import FileTaskConfig, ReasoningGymConfig, TaskConfig
from flashq.data import chat_messages, make_task_source
from flashq.data.files import FileTasks


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_jsonl_source_is_a_deterministic_stream_over_epochs(tmp_path):
    path = write_jsonl(tmp_path / "q.jsonl", [{"question": f"q{i}", "answer": str(i), "extra": [i]} for i in range(5)])
    cfg = FileTaskConfig(path=path, prompt_field="question")
    a, b = FileTasks(cfg, seed=3), FileTasks(cfg, seed=3)
    first = [a.task(k) for k in range(10)]
    assert first == [b.task(k) for k in range(10)]  # same seed, same order
    assert sorted(t["prompt"] for t in first[:5]) == [f"q{i}" for i in range(5)]  # an epoch is a permutation
    assert sorted(t["prompt"] for t in first[5:]) == [f"q{i}" for i in range(5)]
    assert first[7] == FileTasks(cfg, seed=3).task(7)  # resuming at position 7 needs nothing else
    assert all(t["answer"] == t["prompt"][1:] and t["extra"] == [int(t["answer"])] for t in first)


def test_parquet_and_saved_dataset_and_local_repo_layout(tmp_path):
    import datasets

    rows = [{"problem": f"p{i}", "solution": f"\\boxed{{{i}}}"} for i in range(4)]
    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(str(tmp_path / "m.parquet"))
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "saved"))
    (tmp_path / "repo").mkdir()  # how a downloaded hub repository looks: split-named parquet files
    ds.to_parquet(str(tmp_path / "repo" / "train-00000-of-00001.parquet"))
    for path in (tmp_path / "m.parquet", tmp_path / "saved", tmp_path / "repo"):
        src = FileTasks(FileTaskConfig(path=path, prompt_field="problem", answer_field="solution", shuffle=False), 0)
        assert len(src) == 4 and src.task(1)["prompt"] == "p1" and src.task(1)["answer"] == "\\boxed{1}"


def test_bad_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        FileTasks(FileTaskConfig(path=tmp_path / "missing.jsonl"), 0)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{not json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2: not valid JSON"):
        FileTasks(FileTaskConfig(path=bad), 0)
    nofield = write_jsonl(tmp_path / "f.jsonl", [{"prompt": "a"}, {"q": "b"}])
    with pytest.raises(ValueError, match="record 1 .* has no field 'prompt'"):
        FileTasks(FileTaskConfig(path=nofield), 0)
    with pytest.raises(ValueError, match="unsupported file type"):
        FileTasks(FileTaskConfig(path=write_jsonl(tmp_path / "x.csv", [])), 0)


def test_reasoning_gym_tasks_are_seeded_and_score_with_their_own_checker():
    from flashq.rewards.reasoning_gym import FORMAT_CREDIT, score, score_with_format

    cfg = TaskConfig(kind="reasoning_gym", seed=5, reasoning_gym=ReasoningGymConfig(name="basic_arithmetic", size=50))
    src, again = make_task_source(cfg), make_task_source(cfg)
    tasks = [src.task(k) for k in (0, 1, 49, 50)]
    assert tasks == [again.task(k) for k in (0, 1, 49, 50)]
    assert tasks[3]["id"] != tasks[0]["id"] and "<answer>" in tasks[0]["prompt"]
    t = tasks[0]
    assert score(t, f"reasoning... <answer>{t['answer']}</answer>") == 1.0
    assert score(t, "<answer>definitely wrong</answer>") == 0.0
    assert score(t, t["answer"]) == 0.0  # no answer tags: nothing to score
    # with a credit for the asked-for format: a wrong answer in tags earns it, a right one 1, none 0
    assert score_with_format(t, f"<answer>{t['answer']}</answer>") == 1.0
    assert score_with_format(t, "<answer>definitely wrong</answer>") == FORMAT_CREDIT > 0
    assert score_with_format(t, t["answer"]) == 0.0
    # the instruction is the config's, on its own line after the question
    shown = ReasoningGymConfig(name="basic_arithmetic", size=50, instruction="Answer like <answer>42</answer>.")
    other = make_task_source(TaskConfig(kind="reasoning_gym", seed=5, reasoning_gym=shown)).task(0)
    assert other["prompt"] == t["prompt"].rsplit("\n", 1)[0] + "\nAnswer like <answer>42</answer>."
    assert other["answer"] == t["answer"]
    assert score_with_format(t, "inside <answer></answer> inside <answer> </answer>") == 0.0  # empty tags are no answer
    assert score_with_format(t, f"inside <answer></answer> tags: <answer>{t['answer']}</answer>") == 1.0


def test_several_tagged_answers_are_no_answer():
    """A guess in tags at each number, the last one right, earned full marks when the last span
    was the answer: SmolLM2-135M-Instruct learned to do it (flashq.rewards.reasoning_gym.extract_answer)."""
    from flashq.rewards.reasoning_gym import score, score_accuracy_and_format, score_with_format

    cfg = TaskConfig(kind="reasoning_gym", seed=5, reasoning_gym=ReasoningGymConfig(name="basic_arithmetic", size=50))
    t = make_task_source(cfg).task(0)
    right, wrong = str(t["answer"]), str(int(t["answer"]) + 1)
    guessed = f"<answer>{wrong}</answer>\n{wrong} is the first number.\n<answer>{right}</answer>\n{right} is"
    assert score(t, guessed) == score_with_format(t, guessed) == score_accuracy_and_format(t, guessed) == 0.0
    assert score_with_format(t, f"<answer>{right}</answer> so <answer>{right}</answer>") == 0.0  # only one answer is asked for
    assert score_with_format(t, f"<answer>{right}</answer> and then some words") == 1.0


def test_chat_messages_with_and_without_system_prompt():
    task = {"prompt": "1+1="}
    assert chat_messages(task, None) == [{"role": "user", "content": "1+1="}]
    assert chat_messages(task, "Be brief.")[0] == {"role": "system", "content": "Be brief."}


def test_accuracy_and_format_reward_pays_the_right_number_and_the_tags_apart():
    from flashq.rewards.reasoning_gym import ACCURACY_WEIGHT, TAGS_WEIGHT, score_accuracy_and_format

    cfg = TaskConfig(kind="reasoning_gym", seed=5, reasoning_gym=ReasoningGymConfig(name="basic_arithmetic", size=50))
    t = make_task_source(cfg).task(0)
    right, wrong = str(t["answer"]), str(int(t["answer"]) + 1)
    assert score_accuracy_and_format(t, f"So the sum is {right}. <answer>{right}</answer>") == 1.0  # passes
    assert score_accuracy_and_format(t, f"It comes to {wrong}, no, to {right}.") == ACCURACY_WEIGHT  # the last number, untagged
    assert score_accuracy_and_format(t, f"{right}? I make it {wrong}") == 0.0
    assert score_accuracy_and_format(t, f"{right} <answer>{wrong}</answer>") == TAGS_WEIGHT  # the tags' answer is the answer
    assert score_accuracy_and_format(t, f"<answer></answer> {right}") == ACCURACY_WEIGHT  # empty tags earn nothing
    assert score_accuracy_and_format(t, "no number here") == 0.0
