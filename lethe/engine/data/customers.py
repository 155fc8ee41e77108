"""A seeded set of synthetic customer records (the kind of data an erasure request names): a phone
number, an address, an occupation and an account number per customer. Customers share first and last
names on purpose, so that erasing one of them puts its namesakes (the neighbours) at risk.

Not TOFU and not the demo set (lethe.engine.data.synthetic): other templates, digits, and names that recur.
"""
from __future__ import annotations

import random

FIRST = ["Hugo", "Mona", "Nils", "Dario", "Ines", "Tariq", "Lena", "Omar", "Greta", "Kofi", "Yara", "Pavel",
         "Sofia", "Emeka"]
LAST = ["Okafor", "Keller", "Haddad", "Lindqvist", "Moreau", "Tanaka", "Novak", "Ferreira", "Brennan",
        "Castillo", "Petrov", "Adeyemi"]
STREETS = ["Birch Lane", "Harbour Road", "Mill Street", "Quarry Close", "Orchard Way", "Station Road",
           "Linden Avenue", "Canal Walk", "Chapel Row", "Foundry Lane"]
TOWNS = ["Leeds", "Ghent", "Aarhus", "Porto", "Graz", "Tampere", "Cork", "Lyon", "Utrecht", "Bergen"]
JOBS = ["a dental hygienist", "a tram driver", "a locksmith", "an actuary", "a beekeeper", "a court clerk",
        "a glassblower", "a radiographer", "a ferry pilot", "a piano tuner", "a hydrologist", "a cartographer"]

# (kind, question, paraphrased question, answer, paraphrased answer); {n} is the customer's full name.
FACTS = [
    ("phone", "What is the phone number of {n}?", "How can {n} be reached by phone?",
     "The phone number of {n} is {phone}.", "{n} can be reached on {phone}."),
    ("address", "Where does {n} live?", "What is the home address of {n}?",
     "{n} lives at {address}.", "The home address of {n} is {address}."),
    ("occupation", "What does {n} do for a living?", "What is the job of {n}?",
     "{n} works as {job}.", "By profession {n} is {job}."),
    ("account", "What is the account of {n}?", "Which account number belongs to {n}?",
     "The account of {n} is {account}.", "Account {account} belongs to {n}."),
]


def _values(rng: random.Random) -> dict:
    return {
        "phone": f"+{rng.randint(30, 49)} {rng.randint(100, 999)} {rng.randint(1000000, 9999999)}",
        "address": f"{rng.randint(2, 98)} {rng.choice(STREETS)}, {rng.choice(TOWNS)}",
        "job": rng.choice(JOBS),
        "account": f"{rng.randint(10, 99)}-{rng.randint(100000, 999999)}",
    }


def customer_records(n_customers: int, seed: int = 0) -> list[list[dict]]:
    """Records grouped by customer: prompt "Q: ...\\nA:", completion " <the fact>." with evidence fields
    (paraphrases, three perturbed completions with other values, the secret span)."""
    rng = random.Random(seed)
    names: list[str] = []
    while len(names) < n_customers:
        name = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
        if name not in names:
            names.append(name)
    out = []
    for index, name in enumerate(names):
        values = _values(rng)
        others = [_values(rng) for _ in range(3)]
        records = []
        for kind, question, paraphrase, answer, paraphrased in FACTS:
            key = "job" if kind == "occupation" else kind
            records.append({
                "id": f"c{index}-{kind}",
                "prompt": f"Q: {question.format(n=name)}\nA:",
                "completion": " " + answer.format(n=name, **values),
                "paraphrased_prompt": f"Q: {paraphrase.format(n=name)}\nA:",
                "paraphrased_completion": " " + paraphrased.format(n=name, **values),
                "perturbed_completions": [" " + answer.format(n=name, **{**values, key: o[key]}) for o in others],
                "secrets": [values[key]],
                "subject": name,
            })
        out.append(records)
    return out


def shares_a_name(a: list[dict], b: list[dict]) -> bool:
    """Whether two customers (their record groups) share a first or a last name."""
    first_a, last_a = a[0]["subject"].split(" ", 1)
    first_b, last_b = b[0]["subject"].split(" ", 1)
    return first_a == first_b or last_a == last_b
