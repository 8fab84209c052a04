"""Final answers of a text and whether they match a gold answer; torch-free.

Answer checking (:func:`answers_match`) is exact match after normalisation: numbers by value
(the last number of the output, GSM8K ``#### N`` aware), yes/no by the first yes/no word, other
short answers by normalised whole-word containment.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

NUMERIC_GOLD = re.compile(r"^-?\d+(\.\d+)?$")
"""A gold answer that is a plain number (optionally negative, optionally with decimals)."""

# A number not glued to a preceding word or digit: "x-2" and "3-4" give 2 and 4, not -2, -4.
_NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|(?<![\w.])-?\.\d+")


def normalize_number(token: str) -> str | None:
    """'1,234' -> '1234', '3.50' -> '3.5', '5.0' -> '5', '-0' -> '0', '.5' -> '0.5'."""
    token = token.strip().replace(",", "").lstrip("$")
    try:
        value = Decimal(token)
    except InvalidOperation:
        return None
    if not value.is_finite():
        return None
    if value == value.to_integral_value():
        return str(int(value))
    text = format(value.normalize(), "f")
    return "0" if text in ("-0", "0") else text


def extract_final_number(text: str) -> str | None:
    """The last number in ``text``, normalised; after a GSM8K ``####`` marker when present."""
    if text is None:
        return None
    if "####" in text:
        tail = text.rsplit("####", 1)[1]
        found = _NUMBER.findall(tail)
        if found:
            return normalize_number(found[0])
    found = _NUMBER.findall(text)
    if not found:
        return None
    return normalize_number(found[-1])


_YESNO_WORD = re.compile(r"\b(yes|no|true|false)\b", re.IGNORECASE)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = re.compile(r"[^\w\s]")


def _normalize_text(text: str) -> str:
    text = _PUNCT.sub(" ", text.lower())
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def extract_yes_no(text: str) -> str | None:
    """The first yes/no (or true/false) word of ``text`` as 'yes' or 'no'."""
    match = _YESNO_WORD.search(text or "")
    if match is None:
        return None
    return "yes" if match.group(1).lower() in ("yes", "true") else "no"


def answers_match(pred_text: str, gold: str) -> bool:
    """Exact match of a model output against a gold answer, after normalisation.

    - numeric gold: the last number of the output (``#### N`` aware) equals it by value;
    - gold 'yes'/'no'/'true'/'false': the first yes/no/true/false word of the output agrees;
    - any other gold: the normalised gold (lower case, no punctuation or articles) occurs in the
      normalised output as whole words.
    """
    if gold is None or pred_text is None:
        return False
    gold = gold.strip()
    gold_number = normalize_number(gold) if NUMERIC_GOLD.match(gold.replace(",", "")) else None
    if gold_number is not None:
        pred_number = extract_final_number(pred_text)
        return pred_number is not None and Decimal(pred_number) == Decimal(gold_number)
    if gold.lower() in ("yes", "no", "true", "false"):
        return extract_yes_no(pred_text) == extract_yes_no(gold)
    gold_norm = _normalize_text(gold)
    if not gold_norm:
        return False
    return f" {gold_norm} " in f" {_normalize_text(pred_text)} "


_MARKED_NUMBER = re.compile(r"\s*[:=]?\s*\$?\s*(-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)")
_TERMINATED = re.compile(r"[^\d.,]|[.,]\D")
_MARKED_YES_NO = re.compile(r"\s*[:=]?\s*\b(yes|no|true|false)\b(.)?", re.IGNORECASE)
_SENTENCE = re.compile(r"\s*[:=]?\s*([^\n.!?]+)([\n.!?])?")


def marked_answer(text: str, marker: str, gold: str | None = None) -> tuple[str | None, bool]:
    """The answer a text states after its last ``marker`` (e.g. "The answer is"), and whether
    it is complete.

    Returns (answer, complete) in the form of ``gold``: numeric gold (or none) the first
    number after the marker, normalised; yes/no gold the yes/no word; other gold the
    normalised words up to the end of the sentence. ``complete`` says that more text follows
    the answer (a number is complete once a character that cannot continue it follows, e.g.
    "14. " or "14\\n", not "14" or "14."), so a decoder may stop there. (None, False) when
    the marker (matched case-insensitively) or the answer after it is missing.
    """
    if not text or not marker:
        return None, False
    at = text.lower().rfind(marker.lower())
    if at < 0:
        return None, False
    tail = text[at + len(marker) :]
    kind = "number"
    if gold is not None and normalize_number(gold) is None:
        kind = "yesno" if gold.strip().lower() in ("yes", "no", "true", "false") else "text"
    if kind == "number":
        match = _MARKED_NUMBER.match(tail)
        if match is None:
            return None, False
        rest = tail[match.end() :]
        return normalize_number(match.group(1)), bool(_TERMINATED.match(rest))
    if kind == "yesno":
        match = _MARKED_YES_NO.match(tail)
        if match is None:
            return None, False
        word = "yes" if match.group(1).lower() in ("yes", "true") else "no"
        return word, match.group(2) is not None
    match = _SENTENCE.match(tail)
    if match is None or not _normalize_text(match.group(1)):
        return None, False
    return _normalize_text(match.group(1)), match.group(2) is not None
