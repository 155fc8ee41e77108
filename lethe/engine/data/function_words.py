"""English function words: pronouns, determiners, prepositions, conjunctions, auxiliaries and modals, and the few
adverbs that only relate clauses. They are always part of a request's template, however few of its records say
them: they state no fact about anyone, so no record's erasure suppresses them and no audit counts them as a secret.

Why a list and not only the records' own counts: the template is what at least 5 % of the kept answers share, and
in a retain set of a few hundred QA "will", "they" or "such" fall under that. On a model that learned nothing but
its records, every word after a record's name then gains 3-22 nats over the drafts (the drafts are text it never
saw), so they were content, and suppressing their first tokens broke unrelated answers that use them; a draft
about a man made "her" content of an answer about a woman. A function word capitalised inside a sentence ("born in
May", "Will Moreno") names something and stays a candidate (lethe.engine.methods.masc.content.candidate_atoms)."""
from __future__ import annotations

FUNCTION_WORDS = frozenset("""
a an the this that these those such some any each every either neither both all no none another other others own
same several few many much more most less least enough
i me my mine myself we us our ours ourselves you your yours yourself yourselves he him his himself she her hers
herself it its itself they them their theirs themselves one ones oneself who whom whose which what whatever
whoever whichever
be am is are was were been being have has had having do does did done doing will would shall should can could
may might must ought
don doesn didn isn aren wasn weren hasn haven hadn won wouldn shan shouldn cannot couldn mightn mustn ll ve re
of in on at by for with without from to into onto upon about above below over under between among through
throughout during before after since until till against toward towards across along around behind beneath beside
besides beyond near off out up down within via per despite except like unlike than as
and or but nor so yet if then else because although though while whereas whether unless once when whenever where
wherever how why however therefore thus hence also too very just only even still already not never ever
there here
""".split())
