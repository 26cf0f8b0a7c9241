"""The generated answers scored against their references, by well-kept libraries: ROUGE-L
(Google's rouge_score, the F-measure of each answer, their mean), chrF and BLEU (sacrebleu's
corpus scores, 0..100), and exact match after normalisation (lowercase, stripped, whitespace
collapsed, punctuation dropped: SQuAD's normalisation, without its article rule), a share."""

from __future__ import annotations

import string
from collections.abc import Sequence

PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalised(text: str) -> str:
    return " ".join(text.lower().translate(PUNCTUATION).split())


def scores(answers: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """rougeL, chrF, bleu and exactMatch of `answers` against `references` (one each); empty
    when there is no answer."""
    if not answers:
        return {}
    import sacrebleu
    from rouge_score import rouge_scorer  # type: ignore[import-untyped]

    scorer = rouge_scorer.RougeScorer(["rougeL"])
    pairs = list(zip(answers, references, strict=True))
    rouge = [float(scorer.score(reference, answer)["rougeL"].fmeasure) for answer, reference in pairs]
    refs = [list(references)]  # one reference stream: each answer's own reference
    matches = [normalised(answer) == normalised(reference) for answer, reference in pairs]
    return {
        "rougeL": sum(rouge) / len(rouge),
        "chrF": float(sacrebleu.corpus_chrf(list(answers), refs).score),
        "bleu": float(sacrebleu.corpus_bleu(list(answers), refs).score),
        "exactMatch": sum(matches) / len(matches),
    }
