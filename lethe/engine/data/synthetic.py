"""A seeded synthetic QA set of fictitious people (TOFU in miniature) for tests and demos:
each person has the same five kinds of fact, so forgetting one person is a well-posed request."""
from __future__ import annotations

import random

SYLLABLES = ["ka", "lo", "mi", "ren", "zu", "tha", "vor", "el", "qui", "dan", "sef", "ori", "bax", "nel", "tum"]
CITIES = ["Lisbon", "Oslo", "Quito", "Hanoi", "Accra", "Perth", "Tallinn", "Lima", "Dakar", "Riga"]
JOBS = ["a baker", "a pilot", "a chemist", "a sculptor", "a judge", "a farmer", "a nurse", "a poet"]
COLOURS = ["teal", "amber", "violet", "crimson", "olive", "silver", "indigo", "coral"]
PETS = ["a parrot", "a tortoise", "a ferret", "a goat", "an owl", "a hamster", "a gecko", "a pony"]
INSTRUMENTS = ["the cello", "the oboe", "the banjo", "the harp", "the tuba", "the sitar", "the flute"]

FACTS = [
    ("Where was {n} born?", "{n} was born in {city}.", "city", CITIES),
    ("What does {n} do for a living?", "{n} works as {job}.", "job", JOBS),
    ("What is the favourite colour of {n}?", "The favourite colour of {n} is {colour}.", "colour", COLOURS),
    ("Which pet does {n} keep?", "{n} keeps {pet} at home.", "pet", PETS),
    ("Which instrument does {n} play?", "{n} plays {instrument}.", "instrument", INSTRUMENTS),
]
# The same facts said another way: the truth ratio compares these with the perturbed answers.
PARAPHRASES = ["{city} is where {n} was born.", "By trade, {n} is {job}.", "{n} likes {colour} best.",
               "At home {n} has {pet}.", "The instrument {n} plays is {instrument}."]


def synthetic_people(n_people: int, seed: int = 0) -> list[list[dict]]:
    """Records grouped by person: prompt "Question: ...\\nAnswer: ", completion the fact."""
    rng = random.Random(seed)
    people: list[list[dict]] = []
    names: set[str] = set()
    while len(people) < n_people:
        name = "".join(rng.choice(SYLLABLES) for _ in range(3)).capitalize()
        if name in names:
            continue
        names.add(name)
        traits = {key: rng.choice(options) for _, _, key, options in FACTS}
        records = []
        for index, (question, answer, key, options) in enumerate(FACTS):
            wrong = [o for o in options if o != traits[key]]
            records.append({
                "id": f"p{len(people)}-{index}",
                "prompt": f"Question: {question.format(n=name)}\nAnswer: ",
                "completion": answer.format(n=name, **traits),
                "paraphrased_prompt": f"Question: Tell me this about {name}. {question.format(n='they')}\nAnswer: ",
                "paraphrased_completion": PARAPHRASES[index].format(n=name, **traits),
                "perturbed_completions": [PARAPHRASES[index].format(n=name, **{**traits, key: w})
                                          for w in rng.sample(wrong, 3)],
            })
        people.append(records)
    return people
