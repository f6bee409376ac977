"""Task generators (determinism, splits, lengths) and scorers (hand-written cases, garbage)."""

from __future__ import annotations

import json

import pytest

from dllm_decode.eval.tasks import (LONG_LENGTHS, TASKS, WAITING_LINE, Example, load_released, score_released,
                        split_of)
from dllm_decode.eval.tasks.parse import parse_prompt
from dllm_decode.eval.tasks.puzzles import all_latin_squares, all_sudoku_grids, is_latin, solutions
from dllm_decode.eval.tasks.vocab import NAMES


@pytest.mark.parametrize("name", sorted(TASKS))
def test_generator_is_deterministic_per_seed(name):
    task = TASKS[name]
    first, again, other = (task.examples("train", 12, seed) for seed in (3, 3, 4))
    assert first == again
    assert [e.prompt for e in first] != [e.prompt for e in other]


@pytest.mark.parametrize("name", sorted(TASKS))
def test_splits_never_share_an_instance(name):
    task = TASKS[name]
    train = {e.prompt for e in task.examples("train", 300, 0)}
    test = {e.prompt for e in task.examples("test", 60, 0)}
    assert len(train) == 300 and len(test) == 60          # distinct within a split
    assert not train & test
    assert all(split_of(name, p) == "test" for p in test)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_reference_answer_scores_one_and_prompt_parses_back(name):
    task = TASKS[name]
    for ex in task.examples("test", 20, 1):
        assert task.score(ex, ex.answer) == 1.0
        assert task.score(ex, ex.answer + " <|endoftext|> junk after eos") == 1.0
        assert parse_prompt(ex.prompt) == (name, {k: ex.meta[k] for k in parse_prompt(ex.prompt)[1]})


@pytest.mark.parametrize("name", WAITING_LINE)
def test_lengths_cycle_evenly_and_long_split(name):
    task = TASKS[name]
    short = [len(e.meta["items"]) for e in task.examples("test", 8, 0)]
    assert sorted(short) == [3, 3, 4, 4, 5, 5, 6, 6]
    long = {len(e.meta["items"]) for e in task.examples("test", 10, 0, lengths=LONG_LENGTHS)}
    assert long == set(range(8, 13))


@pytest.mark.parametrize("name", sorted(TASKS))
@pytest.mark.parametrize("garbage", ["", "   ", "zzz qqq", "<|endoftext|>", "[ ] , : : :",
                                     "alice " * 50, "\n\t", "<|mdm_mask|> <|mdm_mask|>"])
def test_scorers_survive_garbage(name, garbage):
    task = TASKS[name]
    ex = task.examples("test", 1, 0)[0]
    assert task.score(ex, garbage) == 0.0


def _ex(name: str, items: str, word=None, index=None, answer="") -> Example:
    return Example(name, "unused", answer, {"items": items.split(), "word": word, "index": index})


@pytest.mark.parametrize("name, ex, output, expected", [
    ("copy", _ex("copy", "a b c", answer="a b c"), "a b c", 1.0),
    ("copy", _ex("copy", "a b c", answer="a b c"), "a b c c", 0.0),
    ("sort", _ex("sort", "c a b", answer="a b c"), "a c b", 0.0),
    ("shuffle", _ex("shuffle", "a b c"), "b c a", 1.0),
    ("shuffle", _ex("shuffle", "a b c"), "a b c", 0.0),                  # must differ from input
    ("shuffle", _ex("shuffle", "a b c"), "b b a", 0.0),
    ("shuffle", _ex("shuffle", "a b c"), "b c", 0.0),
    ("insert_random", _ex("insert_random", "a b c", word="d"), "d a b c", 1.0),
    ("insert_random", _ex("insert_random", "a b c", word="d"), "a b c d", 1.0),
    ("insert_random", _ex("insert_random", "a b c", word="d"), "a d c b", 0.0),
    ("insert_random", _ex("insert_random", "a b c", word="d"), "a d b d c", 0.0),
    ("remove_random", _ex("remove_random", "a b c"), "a c", 1.0),
    ("remove_random", _ex("remove_random", "a b c"), "c a", 0.0),
    ("remove_random", _ex("remove_random", "a b c"), "a b c", 0.0),
    ("replace_random", _ex("replace_random", "a b c", word="d"), "a d c", 1.0),
    ("replace_random", _ex("replace_random", "a b c", word="d"), "d d c", 0.0),
    ("replace_random", _ex("replace_random", "a b c", word="d"), "a b c", 0.0),
    ("replace_random", _ex("replace_random", "a b c", word="d"), "a b c d", 0.0),
    ("replace_index", _ex("replace_index", "a b c", "d", 1, answer="a d c"), "d b c", 0.0),
])
def test_list_scorers_on_hand_written_cases(name, ex, output, expected):
    assert TASKS[name].score(ex, output) == expected


def test_index_tasks_use_zero_based_indices():
    by_name = {n: TASKS[n].examples("train", 30, 0) for n in ("insert_index", "remove_index",
                                                               "replace_index")}
    for ex in by_name["insert_index"]:
        assert ex.answer.split()[ex.meta["index"]] == ex.meta["word"]
    for ex in by_name["remove_index"]:
        items = ex.meta["items"]
        assert ex.answer.split() == items[:ex.meta["index"]] + items[ex.meta["index"] + 1:]
    for ex in by_name["replace_index"]:
        assert ex.answer.split()[ex.meta["index"]] == ex.meta["word"]


def test_items_are_distinct_names_and_new_word_is_new():
    for ex in TASKS["replace_random"].examples("train", 50, 0, lengths=LONG_LENGTHS):
        items = ex.meta["items"]
        assert len(set(items)) == len(items) and set(items) <= set(NAMES)
        assert ex.meta["word"] not in items


def test_latin_square_accepts_any_valid_square_only():
    task = TASKS["latin_square"]
    ex = task.examples("test", 1, 0)[0]
    symbols = ex.meta["symbols"]
    other = [symbols[d - 1] for d in all_latin_squares()[-1]]
    assert task.score(ex, " ".join(other)) == 1.0
    broken = other[:]
    broken[0], broken[1] = broken[1], broken[0]             # rows stay permutations, columns break
    assert task.score(ex, " ".join(broken)) == 0.0
    assert not is_latin(other[:15], symbols)


def test_puzzle_enumerations_match_known_counts_and_puzzles_are_unique():
    assert len(all_sudoku_grids()) == 288 and len(all_latin_squares()) == 576
    for ex in TASKS["sudoku"].examples("test", 10, 0):
        puzzle = tuple(ex.meta["puzzle"])
        assert puzzle.count(0) == 4
        assert [" ".join(map(str, s)) for s in solutions(puzzle)] == [ex.answer]


def test_unknown_split_and_bad_lengths_raise():
    with pytest.raises(ValueError, match="split"):
        TASKS["copy"].examples("validation", 1)
    with pytest.raises(ValueError, match="lengths"):
        TASKS["copy"].examples("train", 1, lengths=(5, 2))
    with pytest.raises(ValueError, match="names"):
        TASKS["copy"].examples("train", 1, lengths=(70, 70))


# A fixture in the released layout (invented names; the real files are not vendored).
RELEASED = {
    "waiting_line/copy.jsonl": [{"input": {"context": ["Ann Lee", "Bo Park"], "icl_examples": []},
                                 "label": ["Ann Lee", "Bo Park"], "output_format": ["[MASK]"] * 2}],
    "waiting_line/sort.jsonl": [{"input": {"context": ["Zed Adams", "Amy Young"]},
                                 "label": ["Amy Young", "Zed Adams"]}],
    "waiting_line/replace_random.jsonl": [
        {"input": {"context": ["Ann Lee", "Bo Park", "Cy Diaz"], "word": "Di Wu"},
         "label": {"input": ["Ann Lee", "Bo Park", "Cy Diaz"], "word": "Di Wu",
                   "example": ["Ann Lee", "Di Wu", "Cy Diaz"]}}],
    "waiting_line/shuffle.jsonl": [{"input": {"context": ["A B", "C D", "E F"]},
                                    "label": ["C D", "E F", "A B"]}],
    "puzzle/latin_square_n4.jsonl": [{"input": {"symbols": ["A", "B", "C", "D"], "size": 4},
                                      "label": "A,B,C,D\nB,C,D,A\nC,D,A,B\nD,A,B,C"}],
    "puzzle/sudoku_n4_12.jsonl": [{"input": "1234\n3412\n2143\n4300", "label": "1234\n3412\n2143\n4321"}],
}


@pytest.fixture
def released_dir(tmp_path):
    for rel, rows in RELEASED.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_released_list_tasks_load_and_score(released_dir):
    (copy,) = load_released(released_dir, "copy")
    assert copy.prompt == 'copy : ["Ann Lee", "Bo Park"]'
    assert score_released(copy, 'Sure! ["Ann Lee", "Bo Park"]') == 1.0
    assert score_released(copy, "['Ann Lee', 'Bo Park']<|endoftext|>", mode="lenient") == 1.0
    assert score_released(copy, '["Bo Park", "Ann Lee"]') == 0.0
    (rep,) = load_released(released_dir, "replace_random")
    assert score_released(rep, '["Di Wu", "Bo Park", "Cy Diaz"]') == 1.0
    assert score_released(rep, '["Ann Lee", "Bo Park", "Cy Diaz"]') == 0.0
    (shuf,) = load_released(released_dir, "shuffle")
    assert score_released(shuf, '["E F", "A B", "C D"]') == 1.0
    assert score_released(shuf, '["A B", "C D", "E F"]') == 0.0
    for garbage in ("", "]]][[[", "no list here", '["unterminated'):
        assert score_released(copy, garbage) == 0.0


def test_released_sort_offers_both_orders(released_dir):
    (first,) = load_released(released_dir, "sort", sort_by="first")
    (last,) = load_released(released_dir, "sort", sort_by="last")
    assert score_released(first, '["Amy Young", "Zed Adams"]') == 1.0
    assert score_released(last, '["Zed Adams", "Amy Young"]') == 1.0
    assert score_released(last, '["Amy Young", "Zed Adams"]') == 0.0
    with pytest.raises(ValueError, match="sort_by"):
        load_released(released_dir, "sort", sort_by="middle")


def test_released_puzzles_load_and_score(released_dir):
    (latin,) = load_released(released_dir, "latin_square")
    assert score_released(latin, "Here:\nB,A,D,C\nA,B,C,D\nD,C,B,A\nC,D,A,B") == 1.0
    assert score_released(latin, "A,B,C,D\nA,B,C,D\nC,D,A,B\nD,A,B,C") == 0.0
    assert score_released(latin, "") == 0.0
    (sudoku,) = load_released(released_dir, "sudoku")
    assert sudoku.meta["puzzle"][-2:] == [0, 0]
    assert score_released(sudoku, "1234\n3412\n2143\n4321") == 1.0
    assert score_released(sudoku, "1234\n3412\n2143\n4312") == 0.0
    assert score_released(sudoku, "garbage") == 0.0


def test_released_default_scoring_is_parallelbenchs_own(released_dir):
    """The issue's cases: ParallelBench strips only double quotes and spaces from list items and
    reads a Sudoku only from lines of exactly 4 digits; the lenient mode keeps the old reading."""
    (copy,) = load_released(released_dir, "copy")
    single = "['Ann Lee', 'Bo Park']"
    assert score_released(copy, single) == 0.0
    assert score_released(copy, single, mode="lenient") == 1.0
    assert score_released(copy, '["Ann Lee",\n"Bo Park"]') == 0.0       # a newline is not stripped
    assert score_released(copy, '["Ann Lee","Bo Park"]') == 1.0
    assert score_released(copy, '["Ann Lee","Bo Park"]', mode="parallelbench_strict") == 0.0
    assert score_released(copy, '["Ann Lee", "Bo Park"]', mode="parallelbench_strict") == 1.0
    (sudoku,) = load_released(released_dir, "sudoku")
    one_line = "1234 3412 2143 4321"
    assert score_released(sudoku, one_line) == 0.0
    assert score_released(sudoku, one_line, mode="lenient") == 1.0
    sentence = "The 4x4 grid:\n1234\n3412\n2143\n4321"
    assert score_released(sudoku, sentence) == 1.0
    assert score_released(sudoku, sentence, mode="lenient") == 0.0
    assert score_released(sudoku, sentence, mode="parallelbench_strict") == 0.0
    assert score_released(sudoku, "1 2 3 4\n3,4,1,2\n2143\n4321") == 1.0
    (latin,) = load_released(released_dir, "latin_square")
    trailing = "A,B,C,D,\nB,C,D,A\nC,D,A,B\nD,A,B,C"       # "" is a cell there: the line is dropped
    assert score_released(latin, trailing) == 0.0
    assert score_released(latin, trailing, mode="lenient") == 1.0
    with pytest.raises(ValueError, match="lenient"):
        score_released(copy, "[]", mode="loose")


def test_released_shipped_layout_is_scored_against_its_own_label_text(tmp_path):
    # Rows as ParallelBench ships them (72de8f7): lists as JSON-style strings, the reference under
    # `answer`, Latin symbols as "[H, 4, C, A]" and the Sudoku under `input.sudoku`.
    rows = {
        "waiting_line/copy.jsonl": {"input": {"context": '["Billy Ramos", "Alan Wells"]'},
                                    "answer": '["Billy Ramos", "Alan Wells"]'},
        "waiting_line/remove_random.jsonl": {
            "input": {"context": '["Ann Lee", "Bo Park", "Cy Diaz"]'},
            "answer": {"input": ["Ann Lee", "Bo Park", "Cy Diaz"], "example": '["Ann Lee", "Cy Diaz"]'}},
        "puzzle/latin_square_n4.jsonl": {"input": {"size": 4, "symbols": "[H, 4, C, A]"},
                                         "answer": {"symbols": ["H", "4", "C", "A"],
                                                    "example": "H,4,A,C\n4,C,H,A\nC,A,4,H\nA,H,C,4"}},
        "puzzle/sudoku_n4_12.jsonl": {"input": {"sudoku": "0042\n2031\n4023\n3214"},
                                      "answer": "1342\n2431\n4123\n3214"},
    }
    for rel, row in rows.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(json.dumps(row) + "\n")
    (copy,) = load_released(tmp_path, "copy")
    assert copy.answer == '["Billy Ramos", "Alan Wells"]'
    assert score_released(copy, 'Output: ["Billy Ramos", "Alan Wells"]') == 1.0
    assert score_released(copy, "['Billy Ramos', 'Alan Wells']") == 0.0
    (remove,) = load_released(tmp_path, "remove_random")
    assert score_released(remove, '["Bo Park", "Cy Diaz"]') == 1.0
    assert score_released(remove, '["Cy Diaz", "Bo Park"]') == 0.0
    (latin,) = load_released(tmp_path, "latin_square")
    assert latin.meta["symbols"] == ["H", "4", "C", "A"]
    assert score_released(latin, "4,C,H,A\nH,4,A,C\nA,H,C,4\nC,A,4,H") == 1.0
    (sudoku,) = load_released(tmp_path, "sudoku")
    assert score_released(sudoku, "1342\n2431\n4123\n3214") == 1.0
    assert score_released(sudoku, "1342243141233214") == 0.0


def test_cli_scoring_choices_are_the_released_modes():
    from dllm_decode.cli.evaluate import eval_command
    from dllm_decode.eval.tasks.released import SCORING

    option = next(p for p in eval_command.params if p.name == "released_scoring")
    assert tuple(option.type.choices) == SCORING and option.default == SCORING[0]


def test_released_unknown_task_raises(released_dir):
    with pytest.raises(ValueError, match="unknown released task"):
        load_released(released_dir, "paraphrase")
