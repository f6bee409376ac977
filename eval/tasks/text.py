"""ParallelBench's released Text Writing tasks (Words-to-Sentence, paraphrase, summarization).

Their metrics need optional third-party scorers (ParallelBench's `metrics.py`):
LanguageTool for the grammar score (`language_tool_python`, needs Java and downloads its server
on first use), `rouge_score` for ROUGE-L, `sacrebleu` for BLEU and `bert_score` for BERTScore
(downloads roberta-large). When one is missing the task is skipped with a message naming it;
nothing here is imported unless the task is selected.

Row layout read (`<dir>/words_to_sentence/easy.jsonl`, `<dir>/paraphrase_summarize/samsum.jsonl`):
`{"input": {"words": "dog, park, ball, and throw"}, "answer": {"words": [...], "example": ...}}`,
`{"input": {"text": ...}, "answer": {"summary": ...}}`, `{"input": {"text": ...}, "answer": {...}}`.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from dllm_decode.eval.tasks import Example

TEXT_FILES = {
    "words_to_sentence/easy": "words_to_sentence/easy.jsonl",
    "words_to_sentence/medium": "words_to_sentence/medium.jsonl",
    "words_to_sentence/hard": "words_to_sentence/hard.jsonl",
    "paraphrase": "paraphrase_summarize/chatgpt-paraphrases.jsonl",
    "summarize": "paraphrase_summarize/samsum.jsonl",
}
"""Task name (after `released/`) -> file under the released `output/test` directory."""

NEEDS = {
    "words_to_sentence": ("language_tool_python",),
    "paraphrase": ("language_tool_python", "sacrebleu", "bert_score"),
    "summarize": ("language_tool_python", "rouge_score"),
}
"""Python modules each metric family needs."""

PROMPTS = {
    "words_to_sentence": "Construct a single, coherent sentence using the words {words}.",
    "paraphrase": "Paraphrase the following sentence. Only output the final result.\n\n"
                  "Sentence: {text}\n\nParaphrase:",
    "summarize": "Summarize the following conversation. Only output the final result.\n\n"
                 "{text}\n\nSummary:",
}


def family(task: str) -> str:
    return task.split("/", 1)[0]


def missing_scorers(task: str) -> list[str]:
    """The optional modules `task`'s metric needs that are not installed."""
    return [name for name in NEEDS[family(task)] if importlib.util.find_spec(name) is None]


def load_text_task(directory: str | Path, task: str) -> list[Example]:
    """Examples of one released Text Writing file (prompt rendered as ParallelBench does)."""
    path = Path(directory) / TEXT_FILES[task]
    examples = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        inp, answer = row.get("input", {}), row.get("answer", {})
        kind = family(task)
        if kind == "words_to_sentence":
            words = answer.get("words") or [w.strip() for w in
                                           str(inp["words"]).replace(", and ", ", ").split(",")]
            prompt = PROMPTS[kind].format(words=inp.get("words", ", ".join(words)))
            reference, meta = str(answer.get("example", "")), {"words": list(words)}
        else:
            prompt = PROMPTS[kind].format(text=inp["text"])
            reference = str(answer.get("summary") or answer.get("text") or "")
            meta = {"source": inp["text"], "examples": answer.get("examples")}
        examples.append(Example(f"released/{task}", prompt, reference, meta))
    return examples


def text_scorer(task: str, grammar: Callable[[str], bool] | None = None
                ) -> Callable[[Example, str], float]:
    """ParallelBench's Text Writing metric for `task` (call `missing_scorers` first).

    Args:
        grammar: sentence -> True when grammatical (default: LanguageTool en-US reports no match).
    """
    grammar = grammar or _language_tool()
    kind = family(task)
    if kind == "words_to_sentence":
        def score(example: Example, text: str) -> float:
            # [PB] `inclusion_score`: a case-sensitive substring test per word, AND grammar.
            return float(all(w in text for w in example.meta["words"]) and grammar(text))
        return score
    if kind == "summarize":
        from rouge_score import rouge_scorer

        rouge = rouge_scorer.RougeScorer(["rougeL"])

        def score(example: Example, text: str) -> float:
            return rouge.score(example.answer, text)["rougeL"].fmeasure * float(grammar(text))
        return score
    import sacrebleu
    from bert_score import score as bert_score

    def score(example: Example, text: str) -> float:
        # BLEU against the *source* penalises copying ([PB] `ParaphraseScore`).
        bleu = sacrebleu.sentence_bleu(text, [example.meta["source"]]).score / 100
        f1 = float(bert_score([text], [example.meta["source"]], lang="en")[2][0])
        return (1 - bleu) * f1 * float(grammar(text))
    return score


def _language_tool() -> Callable[[str], bool]:
    import language_tool_python

    tool = language_tool_python.LanguageTool("en-US")
    return lambda text: not tool.check(text)

