"""What each token of a vocabulary is after a letter: the kind of word a counterfactual's replacement may begin with
(lethe.engine.methods.masc.memorisation draws replacements among tokens of the replaced word's kind)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch


@dataclass(frozen=True)
class TokenKinds:
    """Per vocabulary id, what the token is after a letter: a new word (leading whitespace) or a piece of the current
    one, starting upper- or lower-case."""
    new_upper: torch.Tensor
    new_lower: torch.Tensor
    bare_upper: torch.Tensor
    bare_lower: torch.Tensor
    piece: torch.Tensor  # letters only, no whitespace: continues a word


@lru_cache(maxsize=4)
def token_kinds(tokenizer, size: int) -> TokenKinds:
    """Every token's kind, read by decoding it after a fixed first token (byte-level and sentencepiece tokenizers
    alike show a word-initial token's space only in context)."""
    base = tokenizer("a", add_special_tokens=False)["input_ids"][:1]
    head = len(tokenizer.decode(base))
    specials = set(getattr(tokenizer, "all_special_ids", []) or [])
    kinds = torch.zeros(5, size, dtype=torch.bool)
    for token in range(min(size, len(tokenizer))):
        if token in specials:
            continue
        surface = tokenizer.decode(base + [token])[head:]
        word = surface.lstrip()
        if not word or not word.isalpha():
            continue
        if len(word) < len(surface):
            kinds[0 if word[0].isupper() else 1, token] = True
        else:
            kinds[2 if word[0].isupper() else 3, token] = True
            kinds[4, token] = True
    return TokenKinds(*kinds)
