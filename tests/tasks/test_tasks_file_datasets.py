"""The file tasks (jsonl, parquet): rows to prompts, stable identities, and bad input named."""

from __future__ import annotations

import datetime
import decimal
import json
from pathlib import Path
from typing import Any

import pyarrow
import pyarrow.parquet
import pytest

from rollvault.config.errors import ConfigError
from rollvault.config.loading import load_run_config
from rollvault.config.schema import FILE_DATASET_KINDS, DatasetConfig
from rollvault.tasks import jsonl, parquet
from rollvault.tasks._file_rows import DatasetFileError, FileRowDataset
from rollvault.tasks.protocols import PromptDataset, describe_row, prompt_identity
from rollvault.tasks.registry import build_dataset, known_tasks

ROWS: list[dict[str, Any]] = [
    {"prompt": "What is 2+3?", "answer": "5", "level": 1},
    {"prompt": "What is 10/4?", "answer": 2.5, "tags": ["div", "frac"]},
    {"prompt": "What is 7*6?", "answer": 42},
    {"prompt": "Name a prime.", "meta": {"source": "hand", "checked": True}},
    {"prompt": "What is 0-0?", "answer": None},
]
ANSWERS = ["5", "2.5", "42", None, None]
CHATS: list[dict[str, Any]] = [
    {
        "messages": [
            {"role": "system", "content": "Answer with a number."},
            {"role": "user", "content": "2+2?"},
        ],
        "answer": "4",
    },
    {"messages": [{"role": "user", "content": "3+3?"}], "answer": "6"},
]


def _write_jsonl(path: Path, rows: list[Any], *, blank_lines: bool = False) -> Path:
    lines = [json.dumps(row) for row in rows]
    text = "\n\n".join(lines) if blank_lines else "\n".join(lines)
    path.write_text(text + "\n", encoding="utf-8")
    return path


def _write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), path)
    return path


def _build(kind: str, path: Path, **settings: Any) -> FileRowDataset:
    dataset = build_dataset(
        DatasetConfig(kind=kind, path=str(path), **settings), vocab_size=2, seed=0
    )
    assert isinstance(dataset, FileRowDataset)
    return dataset


def _jsonl_error(tmp_path: Path, lines: list[str], **settings: Any) -> DatasetFileError:
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DatasetFileError) as info:
        _build("jsonl", path, **settings)
    return info.value


# -- round trip -----------------------------------------------------------------------


def test_the_file_tasks_are_registered_needing_a_reward_function() -> None:
    tasks = known_tasks()
    assert {name for name in tasks if tasks[name].needs_reward_function} == FILE_DATASET_KINDS
    for task in (jsonl.TASK, parquet.TASK):
        assert task.token_environment is None and task.text_environment is None
        assert task.warmup_examples is None
    assert "_file_rows" not in tasks


def test_jsonl_rows_round_trip(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "data.jsonl", ROWS, blank_lines=True)
    dataset = _build("jsonl", path)
    assert isinstance(dataset, PromptDataset)
    assert len(dataset) == len(ROWS)
    for idx, (row, answer) in enumerate(zip(ROWS, ANSWERS, strict=True)):
        assert dataset[idx] == {
            "idx": idx,
            "task_name": "jsonl",
            "prompt_text": row["prompt"],
            "extra_env_info": {"answer": answer, "row": row},
        }
        # Blank lines are skipped; the row keeps its own line number (1, 3, 5, ...).
        assert dataset.describe(idx) == f"{path} line {2 * idx + 1}"
        assert describe_row(dataset, idx) == f"dataset index {idx} ({path} line {2 * idx + 1})"


def test_parquet_rows_round_trip(tmp_path: Path) -> None:
    rows: list[dict[str, Any]] = [
        {"prompt": "a?", "answer": 1, "score": 0.5},
        {"prompt": "b?", "answer": None, "score": None},
    ]
    path = _write_parquet(tmp_path / "data.parquet", rows)
    dataset = _build("parquet", path)
    assert [dataset[i] for i in range(len(dataset))] == [
        {
            "idx": 0,
            "task_name": "parquet",
            "prompt_text": "a?",
            "extra_env_info": {"answer": "1", "row": rows[0]},
        },
        {
            "idx": 1,
            "task_name": "parquet",
            "prompt_text": "b?",
            "extra_env_info": {"answer": None, "row": rows[1]},
        },
    ]
    assert dataset.describe(1) == f"{path} row 2"


def test_parquet_chat_column_and_rich_values(tmp_path: Path) -> None:
    when = datetime.datetime(2026, 3, 1, 12, 30)
    rows = [
        {**CHATS[0], "when": when, "price": decimal.Decimal("1.50")},
        {**CHATS[1], "when": when, "price": decimal.Decimal("2.00")},
    ]
    path = _write_parquet(tmp_path / "chats.parquet", rows)
    dataset = _build("parquet", path, messages_key="messages")
    assert dataset[0]["messages"] == CHATS[0]["messages"]
    assert "prompt_text" not in dataset[0]
    row = dataset[1]["extra_env_info"]["row"]
    assert row["when"] == "2026-03-01T12:30:00" and row["price"] == "2.00"
    assert dataset[1]["extra_env_info"]["answer"] == "6"


def test_jsonl_chat_rows(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "chats.jsonl", CHATS)
    dataset = _build("jsonl", path, messages_key="messages", prompt_key="unused")
    assert [dataset[i]["messages"] for i in range(2)] == [chat["messages"] for chat in CHATS]
    assert dataset[1]["extra_env_info"] == {"answer": "6", "row": CHATS[1]}


def test_other_prompt_and_answer_keys_and_no_answers(tmp_path: Path) -> None:
    rows = [{"question": "q1", "solution": 3, "answer": "ignored"}]
    path = _write_jsonl(tmp_path / "data.jsonl", rows)
    dataset = _build("jsonl", path, prompt_key="question", answer_key="solution")
    assert dataset[0]["prompt_text"] == "q1"
    assert dataset[0]["extra_env_info"]["answer"] == "3"
    unanswered = _build("jsonl", path, prompt_key="question", answer_key=None)
    assert unanswered[0]["extra_env_info"] == {"answer": None, "row": rows[0]}


def test_every_row_is_the_epoch_and_num_prompts_is_ignored(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "data.jsonl", ROWS)
    assert len(_build("jsonl", path, num_prompts=2)) == len(ROWS)
    assert len(_build("jsonl", path, num_prompts=1000)) == len(ROWS)


def test_identity_is_stable_across_builds_and_follows_the_row(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "data.jsonl", ROWS)
    first, second = _build("jsonl", path), _build("jsonl", path)
    identities = [first.identity(i) for i in range(len(first))]
    assert identities == [second.identity(i) for i in range(len(second))]
    assert identities == [prompt_identity(first[i]) for i in range(len(first))]
    assert len(set(identities)) == len(ROWS)
    # Any field of a row is part of its identity, not only the prompt.
    changed = [dict(row) for row in ROWS]
    changed[3]["meta"] = {"source": "hand", "checked": False}
    edited = _build("jsonl", _write_jsonl(tmp_path / "edited.jsonl", changed))
    assert [edited.identity(i) == identities[i] for i in range(len(ROWS))] == [
        True,
        True,
        True,
        False,
        True,
    ]


def test_parquet_and_jsonl_of_the_same_rows_differ_only_by_task(tmp_path: Path) -> None:
    rows = [{"prompt": "x", "answer": "1"}]
    from_jsonl = _build("jsonl", _write_jsonl(tmp_path / "d.jsonl", rows))
    from_parquet = _build("parquet", _write_parquet(tmp_path / "d.parquet", rows))
    assert {**from_jsonl[0], "task_name": "parquet"} == from_parquet[0]


def test_a_datum_is_a_copy(tmp_path: Path) -> None:
    dataset = _build("jsonl", _write_jsonl(tmp_path / "data.jsonl", ROWS))
    datum = dataset[1]
    datum["extra_env_info"]["row"]["tags"].append("mutated")
    assert dataset[1]["extra_env_info"]["row"]["tags"] == ["div", "frac"]
    assert dataset.identity(1) == prompt_identity(dataset[1])


def test_indexes_are_checked(tmp_path: Path) -> None:
    dataset = _build("jsonl", _write_jsonl(tmp_path / "data.jsonl", ROWS))
    with pytest.raises(IndexError, match=r"index 5 out of range \[0, 5\)"):
        dataset[5]
    with pytest.raises(TypeError, match="must be an int"):
        dataset.identity(True)


def test_a_bom_and_crlf_line_ends_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"prompt": "a"}\r\n{"prompt": "b"}\r\n')
    dataset = _build("jsonl", path)
    assert [dataset[i]["prompt_text"] for i in range(2)] == ["a", "b"]


# -- config rules ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(FILE_DATASET_KINDS))
def test_a_file_kind_needs_a_path(kind: str) -> None:
    with pytest.raises(
        ConfigError, match=f"dataset.kind={kind} reads its rows from a file: set dataset.path"
    ):
        load_run_config(None, [f"dataset.kind={kind}"])


@pytest.mark.parametrize("field", ["path=data.jsonl", "messages_key=messages"])
def test_a_task_that_reads_no_file_refuses_file_settings(field: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_run_config(None, ["dataset.kind=addition", f"dataset.{field}"])
    name = field.split("=")[0]
    assert f"dataset.{name}=" in str(info.value)
    assert "dataset.kind=addition reads no file" in str(info.value)


def test_a_file_config_loads(tmp_path: Path) -> None:
    config = load_run_config(
        None, ["dataset.kind=jsonl", f"dataset.path={tmp_path}/d.jsonl", "dataset.answer_key=null"]
    )
    assert config.dataset.path == f"{tmp_path}/d.jsonl" and config.dataset.answer_key is None


# -- bad input: file, line/row and field named ------------------------------------------


def test_a_builder_without_a_path_says_so() -> None:
    # The config rules refuse this first; a builder called directly says it too.
    with pytest.raises(ConfigError, match="dataset.kind=jsonl reads its rows from a file"):
        jsonl.build_jsonl_dataset(DatasetConfig(kind="jsonl"), seed=0, vocab_size=2)


def test_a_missing_file(tmp_path: Path) -> None:
    for kind in sorted(FILE_DATASET_KINDS):
        with pytest.raises(DatasetFileError) as info:
            _build(kind, tmp_path / "nope.data")
        assert (
            str(info.value) == f"dataset file {tmp_path / 'nope.data'}: no such file (dataset.path)"
        )
        assert isinstance(info.value, ConfigError)
    with pytest.raises(DatasetFileError, match="not a regular file"):
        _build("jsonl", tmp_path)


def test_an_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    for content in ("", "\n  \n\n"):
        path.write_text(content, encoding="utf-8")
        with pytest.raises(DatasetFileError) as info:
            _build("jsonl", path)
        assert (
            str(info.value)
            == f"dataset file {path}: holds no rows (a dataset needs at least one prompt)"
        )
    table = pyarrow.table({"prompt": pyarrow.array([], type=pyarrow.string())})
    pyarrow.parquet.write_table(table, tmp_path / "empty.parquet")
    with pytest.raises(DatasetFileError, match="empty.parquet: holds no rows"):
        _build("parquet", tmp_path / "empty.parquet")


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('{"prompt": "a"', "invalid JSON: Expecting ',' delimiter at column 15"),
        ('{"prompt": NaN}', "invalid JSON: NaN is not JSON"),
        ('{"prompt": "a", "prompt": "b"}', "invalid JSON: the key 'prompt' appears twice"),
        ("[1, 2]", "a row must be an object (a mapping of fields), got array [1, 2]"),
        ('"just text"', 'a row must be an object (a mapping of fields), got string "just text"'),
    ],
)
def test_a_line_that_is_no_row(tmp_path: Path, line: str, problem: str) -> None:
    error = _jsonl_error(tmp_path, ['{"prompt": "fine"}', "", line])
    assert str(error).startswith(f"dataset file {tmp_path / 'data.jsonl'}, line 3: {problem}")
    assert error.place == "line 3" and error.field is None


def test_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n{"prompt": "\xff"}\n')
    with pytest.raises(DatasetFileError, match=r"data.jsonl, line 2: not UTF-8 text"):
        _build("jsonl", path)


def test_a_missing_prompt_key_lists_the_fields(tmp_path: Path) -> None:
    error = _jsonl_error(tmp_path, ['{"prompt": "a"}', '{"question": "b", "answer": "1"}'])
    assert str(error) == (
        f"dataset file {tmp_path / 'data.jsonl'}, line 2, field 'prompt': the row has no field "
        "'prompt' (dataset.prompt_key); its fields: 'question', 'answer'"
    )


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("7", "the prompt must be a string, got number 7"),
        ("null", "the prompt must be a string, got null"),
        ('["a"]', 'the prompt must be a string, got array ["a"]'),
        ('""', "the prompt is empty"),
        ('"   "', "the prompt is empty"),
    ],
)
def test_a_prompt_that_is_not_a_nonempty_string(tmp_path: Path, value: str, problem: str) -> None:
    error = _jsonl_error(tmp_path, ['{"prompt": "a"}', '{"prompt": "b"}', f'{{"prompt": {value}}}'])
    assert (
        str(error) == f"dataset file {tmp_path / 'data.jsonl'}, line 3, field 'prompt': {problem}"
    )


@pytest.mark.parametrize(
    ("messages", "field", "problem"),
    [
        (
            '"hi"',
            "messages",
            'must be a non-empty list of {role, content} mappings, got string "hi"',
        ),
        ("[]", "messages", "must be a non-empty list of {role, content} mappings, got array []"),
        (
            '["hi"]',
            "messages[0]",
            "a chat turn must be a mapping with exactly the keys 'role' and 'content', got string \"hi\"",
        ),
        (
            '[{"role": "user"}]',
            "messages[0]",
            "exactly the keys 'role' and 'content', got keys ['role']",
        ),
        (
            '[{"role": "user", "content": "a", "name": "x"}]',
            "messages[0]",
            "got keys ['content', 'name', 'role']",
        ),
        (
            '[{"role": "user", "content": "a"}, {"role": 1, "content": "b"}]',
            "messages[1].role",
            "must be a non-empty string, got number 1",
        ),
        (
            '[{"role": "", "content": "a"}]',
            "messages[0].role",
            'must be a non-empty string, got string ""',
        ),
        (
            '[{"role": "user", "content": null}]',
            "messages[0].content",
            "must be a string, got null",
        ),
    ],
)
def test_messages_that_are_not_a_chat(
    tmp_path: Path, messages: str, field: str, problem: str
) -> None:
    error = _jsonl_error(tmp_path, [f'{{"messages": {messages}}}'], messages_key="messages")
    assert str(error).startswith(
        f"dataset file {tmp_path / 'data.jsonl'}, line 1, field {field!r}: "
    )
    assert problem in str(error)
    assert error.field == field


def test_a_missing_messages_key(tmp_path: Path) -> None:
    error = _jsonl_error(tmp_path, ['{"prompt": "a"}'], messages_key="chat")
    assert "line 1, field 'chat': the row has no field 'chat' (dataset.messages_key)" in str(error)


@pytest.mark.parametrize(
    ("answer", "shown"),
    [("true", "boolean true"), ("[1]", "array [1]"), ('{"a": 1}', 'object {"a": 1}')],
)
def test_an_answer_of_an_unsupported_type(tmp_path: Path, answer: str, shown: str) -> None:
    error = _jsonl_error(tmp_path, [f'{{"prompt": "a", "answer": {answer}}}'])
    assert str(error) == (
        f"dataset file {tmp_path / 'data.jsonl'}, line 1, field 'answer': the answer "
        f"(dataset.answer_key) must be a string or a number, got {shown}"
    )


def test_a_lone_surrogate_is_refused(tmp_path: Path) -> None:
    error = _jsonl_error(tmp_path, ['{"prompt": "a\\ud800"}'])
    assert "line 1: the row cannot be encoded as UTF-8 JSON" in str(error)


def test_parquet_errors_name_the_row_number(tmp_path: Path) -> None:
    rows = [{"prompt": "a", "answer": "1"}, {"prompt": "", "answer": "2"}]
    path = _write_parquet(tmp_path / "data.parquet", rows)
    with pytest.raises(DatasetFileError) as info:
        _build("parquet", path)
    assert str(info.value) == f"dataset file {path}, row 2, field 'prompt': the prompt is empty"


def test_parquet_values_json_cannot_hold(tmp_path: Path) -> None:
    path = _write_parquet(
        tmp_path / "nan.parquet",
        [{"prompt": "a", "score": 1.0}, {"prompt": "b", "score": float("nan")}],
    )
    with pytest.raises(
        DatasetFileError, match=r"row 2, field 'score': nan is not a number JSON can hold"
    ):
        _build("parquet", path)
    raw = _write_parquet(tmp_path / "bytes.parquet", [{"prompt": "a", "blob": b"\x00"}])
    with pytest.raises(DatasetFileError, match=r"row 1, field 'blob': a value of type bytes"):
        _build("parquet", raw)


def test_a_file_that_is_not_parquet(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "data.parquet", ROWS)
    with pytest.raises(DatasetFileError, match=r"data.parquet: not a readable Parquet file"):
        _build("parquet", path)


def test_the_first_bad_row_is_named_even_far_into_a_file(tmp_path: Path) -> None:
    lines = [json.dumps({"prompt": f"p{i}"}) for i in range(500)]
    lines[417] = json.dumps({"prompt": 417})
    error = _jsonl_error(tmp_path, lines)
    assert error.place == "line 418" and error.field == "prompt"
