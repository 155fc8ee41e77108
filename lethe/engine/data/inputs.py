"""A request's records as one run reads them (issue 27): checked and normalised once (SPEC section 2), with the
format they are shown to a model in. Unlearning, the forgetting audit and connectivity all take this one object;
`seen` gives the records as a particular tokenizer sees them (chat template, long documents as windows), `tokenised`
their token ids, encoded once per tokenizer and context and shared by the three. Torch-free until `tokenised`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lethe.engine.contract.chat_format import check_format, render
from lethe.engine.contract.record_checks import normalise_records
from lethe.engine.data.documents import split_documents

if TYPE_CHECKING:
    from lethe.engine.data.tokenised import TokenisedInputs


@dataclass(frozen=True)
class RunInputs:
    forget: list[dict]  # empty only for a connectivity run that measures retain records alone
    retain: list[dict] = field(default_factory=list)
    holdout: list[dict] = field(default_factory=list)  # records the model never saw
    format: str = "plain"  # "plain" or "chat" (lethe.engine.contract.chat_format)
    # (tokenizer fingerprint, context, seed) -> TokenisedInputs; filled by `tokenised`, not part of the value.
    _tokens: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, forget: list[dict] | None, retain: list[dict] | None = None, holdout: list[dict] | None = None,
           format: str = "plain", *, forget_required: bool = True) -> RunInputs:
        """From JSON records (a request, a file): checked and normalised, here and only here."""
        return cls(normalise_records(forget, "forget") if forget or forget_required else [],
                   normalise_records(retain or [], "retain", allow_empty=True),
                   normalise_records(holdout or [], "holdout", allow_empty=True), check_format(format))

    def seen(self, tokenizer: Any, max_length: int) -> tuple[list[dict], list[dict], list[dict]]:
        """forget, retain and holdout as a model sees them through `tokenizer`: rendered in its chat template where
        the format asks for it, a `text` record longer than `max_length` tokens as its windows."""
        forget, retain, holdout = (split_documents(render(records, tokenizer, self.format, what), tokenizer,
                                                   max_length, what)
                                   for records, what in ((self.forget, "forget"), (self.retain, "retain"),
                                                         (self.holdout, "holdout")))
        return forget, retain, holdout

    def tokenised(self, tokenizer: Any, max_length: int, seed: int) -> TokenisedInputs:
        """The records as `seen` through `tokenizer` and their encodings (lethe.engine.data.tokenised): computed on
        the first call for this tokenizer, context and seed, read back by the later ones (the run's audit and
        curves). `records(what)` hands out copies."""
        from lethe.engine.data.tokenised import TokenisedInputs, tokenizer_fingerprint

        fingerprint = tokenizer_fingerprint(tokenizer)
        key = (fingerprint, max_length, seed)
        if fingerprint is None or key not in self._tokens:
            tokens = TokenisedInputs.encode(self.seen(tokenizer, max_length), tokenizer, max_length, seed)
            if fingerprint is None:
                return tokens
            self._tokens[key] = tokens
        return self._tokens[key]
