#!/usr/bin/env python3
"""Synthetic chat corpus for the bundled demo model (models/demo).

Our own generator writes Qwen3.5-style conversations (ChatML turns, `<think>` reasoning with thinking on and
off, system prompts, multi-turn, Qwen3-Coder XML tool calls with tool responses) and renders them through
scripts/chat_template.jinja. Tasks: two-digit addition and subtraction with column-wise working, primality
and factorisation, counting, comparing and sorting numbers, reversing and spelling words, short Python
functions, and tool use.

A fixed set of held-out prompts (operand pairs, (number, phrasing), (word, task), (function name, parameter,
phrasing), tool arguments) is split off first and written to tests/data/demo/heldout.jsonl; every training
conversation is rejected if it uses any held-out key, anywhere in the conversation.

Usage:
  python scripts/make_demo_corpus.py --out /tmp/demo/corpus.jsonl --num-train 250000
  python scripts/make_demo_corpus.py --smoke --out /tmp/demo_smoke/corpus.jsonl
"""
from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CHAT_TEMPLATE_PATH = REPO_ROOT / "scripts" / "chat_template.jinja"
HELDOUT_PATH = REPO_ROOT / "tests" / "data" / "demo" / "heldout.jsonl"
SHOWCASE_PATH = REPO_ROOT / "tests" / "data" / "demo" / "showcase.jsonl"

CORPUS_SEED = 20260131

# ----------------------------------------------------------------------------------------------------------
# Vocabulary of the generator
# ----------------------------------------------------------------------------------------------------------

WORDS = """
apple banana cherry grape lemon mango melon orange peach pear plum berry olive onion carrot potato tomato
garden forest river ocean mountain valley desert island meadow canyon harbor bridge castle tower village
city street market school library museum castle palace temple window door table chair pillow blanket
mirror candle basket bottle bucket hammer ladder pencil paper letter number circle square triangle
planet rocket comet galaxy meteor orbit moon star cloud storm thunder rain snow winter summer autumn spring
morning evening night today tomorrow yesterday minute hour second season holiday journey travel ticket
animal rabbit tiger lion zebra monkey donkey horse camel turtle dolphin whale shark eagle falcon parrot
spider beetle butterfly dragon kitten puppy mouse squirrel badger beaver otter penguin giraffe koala
doctor teacher farmer singer painter writer baker driver pilot sailor artist dancer hunter soldier
happy sad brave quiet loud gentle clever simple honest proud calm eager funny lucky lazy busy kind
purple yellow silver golden orange violet crimson green brown black white pink
music guitar piano violin trumpet drum melody rhythm song poem story novel chapter page word sentence
computer keyboard monitor printer network signal battery charger cable screen button folder program
python rust kernel server client packet thread memory buffer vector matrix tensor layer token model
coffee tea sugar butter cheese bread honey pepper salt soup salad pasta pizza noodle rice cookie cake
friend family mother father sister brother cousin uncle parent child baby neighbor stranger
water fire earth wind light shadow smoke dust stone metal glass wood paper plastic silk cotton
jump run walk swim climb dance sing write read speak listen think dream smile laugh travel build
bright dark early late fast slow heavy light sharp smooth rough soft strong weak tall short wide
engine wheel brake mirror pedal helmet jacket glove boots scarf shirt pocket button zipper collar
anchor compass lantern blanket kettle teapot saucer spoon fork knife plate bowl napkin oven sink
question answer problem puzzle riddle secret reason result method system pattern balance circle
""".split()
WORDS = sorted(set(w for w in WORDS if 3 <= len(w) <= 10))

CITIES = sorted(set("""
Paris London Berlin Madrid Rome Vienna Prague Warsaw Lisbon Dublin Oslo Stockholm Helsinki Copenhagen
Amsterdam Brussels Zurich Geneva Athens Istanbul Cairo Nairobi Lagos Accra Tokyo Osaka Seoul Beijing
Shanghai Singapore Bangkok Hanoi Manila Jakarta Delhi Mumbai Karachi Dubai Doha Tehran Moscow Kyiv
Toronto Montreal Vancouver Chicago Boston Denver Seattle Austin Miami Houston Phoenix Atlanta Dallas
Lima Bogota Santiago Quito Caracas Havana Sydney Melbourne Perth Auckland Wellington Reykjavik Tunis
""".split()))

SEARCH_TOPICS = [
    "the tallest mountain in Europe", "how rainbows form", "the history of the bicycle", "the speed of sound",
    "the largest desert on Earth", "how bees make honey", "the first moon landing", "the boiling point of water",
    "the longest river in Africa", "how vaccines work", "the inventor of the telephone", "the age of the universe",
    "the deepest lake in the world", "how solar panels work", "the capital of Australia", "the origin of chess",
    "why the sky is blue", "how volcanoes erupt", "the population of Iceland", "the fastest land animal",
    "how tides work", "the smallest planet", "the oldest tree", "how glass is made", "the history of paper",
    "the coldest place on Earth", "how airplanes fly", "the biggest ocean", "how magnets work",
    "the invention of the printing press", "how clouds form", "the rings of Saturn", "the history of tea",
    "how earthquakes happen", "the largest coral reef", "the first computer", "how batteries store energy",
    "the migration of birds", "the highest waterfall", "how plants make oxygen",
]
SEARCH_SNIPPETS = {
    topic: f"A short encyclopedia entry about {topic}." for topic in SEARCH_TOPICS
}

CURRENCIES = ["USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "SEK"]
CONDITIONS = ["sunny", "cloudy", "rainy", "windy", "snowy", "foggy", "partly cloudy", "stormy"]

SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are a concise math tutor. Show your reasoning, then give the answer.",
    "You are the deltaserve demo model. Answer carefully.",
    "You are a friendly assistant that explains things step by step.",
    "You are a precise assistant. Keep answers short.",
    "You help with arithmetic, words and small Python programs.",
    "You are a careful assistant. Think before you answer.",
    "You are a coding assistant that writes clean Python.",
]

SMALLTALK = [
    ("Hello!", "The user greets me. I should greet back and offer help.", "Hello! How can I help you today?"),
    ("Hi there.", "A greeting. Reply politely.", "Hi! What can I do for you?"),
    ("Who are you?", "The user asks who I am. I am a small demo model.",
     "I am a small demo language model. I can do arithmetic, check primes, work with words and write short Python functions."),
    ("What can you do?", "The user asks about my abilities. List them briefly.",
     "I can add and subtract numbers, check whether numbers are prime, factor them, count, compare and sort numbers, "
     "reverse and spell words, write short Python functions, and call tools when they are available."),
    ("Thank you!", "The user thanks me. Reply briefly.", "You're welcome!"),
    ("Thanks, that helps.", "The user is satisfied. Reply briefly.", "Glad I could help!"),
    ("Good morning.", "A morning greeting. Greet back.", "Good morning! How can I help?"),
    ("Goodbye.", "The user says goodbye.", "Goodbye! Have a nice day."),
]


def tool_schema(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


TOOLS = {
    "get_weather": tool_schema(
        "get_weather", "Get the current weather in a city.",
        {"city": {"type": "string", "description": "Name of the city"},
         "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature unit"}},
        ["city"]),
    "calculator": tool_schema(
        "calculator", "Evaluate an arithmetic expression exactly.",
        {"expression": {"type": "string", "description": "The expression, for example 12 * 34"}},
        ["expression"]),
    "get_time": tool_schema(
        "get_time", "Get the current local time in a city.",
        {"city": {"type": "string", "description": "Name of the city"}},
        ["city"]),
    "search_web": tool_schema(
        "search_web", "Search the web and return the top result.",
        {"query": {"type": "string", "description": "The search query"}},
        ["query"]),
    "convert_currency": tool_schema(
        "convert_currency", "Convert an amount of money from one currency to another.",
        {"amount": {"type": "number", "description": "Amount to convert"},
         "from_currency": {"type": "string", "description": "Currency code to convert from"},
         "to_currency": {"type": "string", "description": "Currency code to convert to"}},
        ["amount", "from_currency", "to_currency"]),
}
TOOL_NAMES = sorted(TOOLS)

PRIMES_BELOW_100 = [p for p in range(2, 100) if all(p % d for d in range(2, int(p**0.5) + 1))]


def is_prime(n: int) -> bool:
    return n >= 2 and all(n % d for d in range(2, int(n**0.5) + 1))


def prime_factors(n: int) -> list[int]:
    factors, d = [], 2
    while d * d <= n:
        while n % d == 0:
            factors.append(d)
            n //= d
        d += 1
    if n > 1:
        factors.append(n)
    return factors


def spaced_list(values) -> str:
    return ", ".join(str(v) for v in values)


# ----------------------------------------------------------------------------------------------------------
# Conversation records
# ----------------------------------------------------------------------------------------------------------


@dataclass
class Turn:
    """One assistant turn to be trained (or, for held-out prompts, to be generated)."""

    reasoning: str
    content: str
    tool_calls: list[dict] | None = None


@dataclass
class Example:
    task: str
    keys: list[str]
    user: str
    turns: list[Turn]
    tool_responses: list[str] = field(default_factory=list)
    tools: list[str] | None = None
    expected: dict = field(default_factory=dict)


def tool_call(name: str, arguments: dict) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


# ----------------------------------------------------------------------------------------------------------
# Task generators. Each takes (rng, pick) where pick(pool) chooses an item; the caller's pick decides whether
# items come from the held-out pool or the training pool.
# ----------------------------------------------------------------------------------------------------------

ADD_PHRASINGS = [
    "What is {a}+{b}?", "What is {a} + {b}?", "Compute {a} + {b}.", "Calculate {a} plus {b}.",
    "Add {a} and {b}.", "What is the sum of {a} and {b}?", "{a} + {b} = ?", "Please add {a} to {b}.",
    "What do you get when you add {a} and {b}?", "How much is {a} plus {b}?",
]
SUB_PHRASINGS = [
    "What is {a}-{b}?", "What is {a} - {b}?", "Compute {a} - {b}.", "Calculate {a} minus {b}.",
    "Subtract {b} from {a}.", "What is the difference {a} - {b}?", "{a} - {b} = ?", "How much is {a} minus {b}?",
    "What do you get when you take {b} away from {a}?", "Work out {a} - {b}.",
]
BRIEF_SUFFIX = " Answer briefly."


def addition_reasoning(a: int, b: int) -> str:
    if a < 10 and b < 10:
        return f"{a} + {b} = {a + b}."
    a_tens, a_ones = divmod(a, 10)
    b_tens, b_ones = divmod(b, 10)
    ones = a_ones + b_ones
    carry, ones_digit = divmod(ones, 10)
    tens = a_tens + b_tens + carry
    return (
        f"Add {a} and {b} column by column.\n"
        f"Ones: {a_ones} + {b_ones} = {ones}. Write {ones_digit}, carry {carry}.\n"
        f"Tens: {a_tens} + {b_tens} + {carry} = {tens}. Write {tens}.\n"
        f"So {a} + {b} = {a + b}."
    )


def subtraction_steps(big: int, small: int) -> str:
    if big < 10:
        return f"{big} - {small} = {big - small}."
    big_tens, big_ones = divmod(big, 10)
    small_tens, small_ones = divmod(small, 10)
    if big_ones < small_ones:
        ones_line = (f"Ones: {big_ones} is less than {small_ones}, borrow 1: "
                     f"{big_ones + 10} - {small_ones} = {big_ones + 10 - small_ones}. Write {big_ones + 10 - small_ones}.")
        borrow = 1
    else:
        ones_line = (f"Ones: {big_ones} is not less than {small_ones}, borrow 0: "
                     f"{big_ones} - {small_ones} = {big_ones - small_ones}. Write {big_ones - small_ones}.")
        borrow = 0
    tens = big_tens - borrow - small_tens
    return (
        f"Subtract {small} from {big} column by column.\n{ones_line}\n"
        f"Tens: {big_tens} - {borrow} - {small_tens} = {tens}. Write {tens}.\n"
        f"So {big} - {small} = {big - small}."
    )


def subtraction_reasoning(a: int, b: int) -> str:
    if a >= b:
        return subtraction_steps(a, b)
    return (
        f"{a} is less than {b}, so the result is negative: {a} - {b} = -({b} - {a}).\n"
        f"{subtraction_steps(b, a)}\nSo {a} - {b} = {a - b}."
    )


def arithmetic_example(op: str, a: int, b: int, phrasing: int, brief: bool) -> Example:
    if op == "add":
        user = ADD_PHRASINGS[phrasing].format(a=a, b=b)
        value, reasoning, symbol = a + b, addition_reasoning(a, b), "+"
    else:
        user = SUB_PHRASINGS[phrasing].format(a=a, b=b)
        value, reasoning, symbol = a - b, subtraction_reasoning(a, b), "-"
    if brief:
        user += BRIEF_SUFFIX
        content = str(value)
    else:
        content = f"{a} {symbol} {b} = {value}."
    return Example(task=op, keys=[f"{op}:{a}:{b}"], user=user, turns=[Turn(reasoning, content)],
                   expected={"answer": value})


PRIME_PHRASINGS = [
    "Is {n} prime?", "Is {n} a prime number?", "Check whether {n} is prime.", "Is the number {n} prime or composite?",
    "Tell me if {n} is a prime.", "Determine if {n} is prime.", "{n}: prime or not?", "Is {n} a prime?",
]


def primality_reasoning(n: int) -> tuple[str, str]:
    """Trial division by the primes p with p * p <= n; returns (reasoning, short verdict)."""
    if n < 2:
        return (f"{n} is less than 2. A prime needs exactly two divisors, so {n} is not prime.", "not prime")
    candidates = [p for p in PRIMES_BELOW_100 if p * p <= n]
    if not candidates:
        return (f"No prime p has p × p ≤ {n}, so nothing can divide {n}. So {n} is prime.", "prime")
    lines = [f"Test the primes p with p × p ≤ {n}: {spaced_list(candidates)}."]
    for p in candidates:
        q, r = divmod(n, p)
        if r == 0:
            lines.append(f"{n} ÷ {p} = {q} remainder 0, so {p} divides {n}.")
            lines.append(f"{n} = {p} × {q}, so {n} is not prime.")
            return "\n".join(lines), "not prime"
        lines.append(f"{n} ÷ {p} = {q} remainder {r}.")
    lines.append(f"No prime divides {n}, so {n} is prime.")
    return "\n".join(lines), "prime"


def primality_example(n: int, phrasing: int, brief: bool) -> Example:
    reasoning, verdict = primality_reasoning(n)
    user = PRIME_PHRASINGS[phrasing].format(n=n)
    prime = verdict == "prime"
    if brief:
        user += " Answer yes or no."
        content = "Yes." if prime else "No."
    elif prime:
        content = f"Yes, {n} is prime."
    elif n < 2:
        content = f"No, {n} is not prime."
    else:
        p = prime_factors(n)[0]
        content = f"No, {n} is not prime ({n} = {p} × {n // p})."
    return Example(task="prime", keys=[f"prime:{n}:{phrasing}"], user=user, turns=[Turn(reasoning, content)],
                   expected={"is_prime": prime})


FACTOR_PHRASINGS = [
    "Factor {n}.", "What is the prime factorization of {n}?", "Find the prime factors of {n}.",
    "Write {n} as a product of primes.", "Factorise {n}.", "Break {n} into prime factors.",
]


def factor_example(n: int, phrasing: int) -> Example:
    factors = prime_factors(n)
    product = " × ".join(str(f) for f in factors)
    if len(factors) == 1:
        reasoning = primality_reasoning(n)[0] + f"\nSo the factorization of {n} is just {n}."
        content = f"{n} is prime, so {n} = {n}."
    else:
        lines = [f"Divide out the smallest prime factor again and again, starting with {n}."]
        rest = n
        for f in factors[:-1]:
            lines.append(f"{rest} ÷ {f} = {rest // f}.")
            rest //= f
        lines.append(f"{rest} is prime.")
        lines.append(f"So {n} = {product}.")
        reasoning = "\n".join(lines)
        content = f"{n} = {product}."
    return Example(task="factor", keys=[f"factor:{n}:{phrasing}"], user=FACTOR_PHRASINGS[phrasing].format(n=n),
                   turns=[Turn(reasoning, content)], expected={"factors": factors})


LETTER_COUNT_PHRASINGS = [
    "How many letters are in the word '{w}'?", "Count the letters in '{w}'.", "How long is the word '{w}'?",
]
LETTER_OCCURRENCE_PHRASINGS = [
    "How many times does the letter '{c}' appear in '{w}'?", "Count the letter '{c}' in the word '{w}'.",
]
LIST_COUNT_PHRASINGS = ["How many numbers are in this list: {xs}?", "Count the numbers: {xs}."]
COUNT_RANGE_PHRASINGS = ["Count from {a} to {b}.", "List the numbers from {a} to {b}."]


def letter_count_example(word: str, phrasing: int) -> Example:
    numbered = ", ".join(f"{c} ({i + 1})" for i, c in enumerate(word))
    reasoning = f"Go through '{word}' letter by letter: {numbered}.\nSo '{word}' has {len(word)} letters."
    return Example(task="count", keys=[f"letters:{word}"], user=LETTER_COUNT_PHRASINGS[phrasing].format(w=word),
                   turns=[Turn(reasoning, f"The word '{word}' has {len(word)} letters.")],
                   expected={"answer_text": f"The word '{word}' has {len(word)} letters."})


def letter_occurrence_example(word: str, letter: str, phrasing: int) -> Example:
    seen, parts = 0, []
    for c in word:
        if c == letter:
            seen += 1
            parts.append(f"{c}: yes, {seen}")
        else:
            parts.append(f"{c}: no")
    times = "time" if seen == 1 else "times"
    reasoning = f"Check each letter of '{word}' for '{letter}'.\n" + "\n".join(parts) + \
        f"\nSo '{letter}' appears {seen} {times} in '{word}'."
    content = f"The letter '{letter}' appears {seen} {times} in '{word}'."
    return Example(task="count", keys=[f"occurs:{word}:{letter}"],
                   user=LETTER_OCCURRENCE_PHRASINGS[phrasing].format(c=letter, w=word),
                   turns=[Turn(reasoning, content)], expected={"answer_text": content})


def list_count_example(xs: list[int], phrasing: int) -> Example:
    numbered = ", ".join(f"{x} ({i + 1})" for i, x in enumerate(xs))
    reasoning = f"Number the items: {numbered}.\nThere are {len(xs)} numbers."
    content = f"There are {len(xs)} numbers in the list."
    return Example(task="count", keys=[f"listcount:{spaced_list(xs)}"],
                   user=LIST_COUNT_PHRASINGS[phrasing].format(xs=spaced_list(xs)),
                   turns=[Turn(reasoning, content)], expected={"answer_text": content})


def count_range_example(a: int, b: int, phrasing: int) -> Example:
    values = spaced_list(range(a, b + 1))
    reasoning = f"Start at {a} and add 1 each time until {b}: {values}."
    return Example(task="count", keys=[f"range:{a}:{b}"], user=COUNT_RANGE_PHRASINGS[phrasing].format(a=a, b=b),
                   turns=[Turn(reasoning, values)], expected={"answer_text": values})


def compare_pair_reasoning(a: int, b: int) -> tuple[str, int]:
    """Digit-wise comparison; returns (reasoning, larger)."""
    if a == b:
        return f"{a} and {b} are the same number.", a
    if (a < 10) != (b < 10):
        one, two = (a, b) if a < 10 else (b, a)
        return f"{one} has one digit and {two} has two digits, so {two} is larger.", two
    if a < 10:
        larger = max(a, b)
        return f"Both have one digit. {larger} > {min(a, b)}, so {larger} is larger.", larger
    at, bt = a // 10, b // 10
    if at != bt:
        larger = a if at > bt else b
        return (f"Compare the tens digits: {at} and {bt}. {max(at, bt)} > {min(at, bt)}, so {larger} is larger.",
                larger)
    ao, bo = a % 10, b % 10
    larger = a if ao > bo else b
    return (f"The tens digits are equal ({at}). Compare the ones digits: {ao} and {bo}. "
            f"{max(ao, bo)} > {min(ao, bo)}, so {larger} is larger."), larger


COMPARE_PHRASINGS = ["Which is larger, {a} or {b}?", "Which number is bigger: {a} or {b}?",
                     "Which is smaller, {a} or {b}?", "Is {a} greater than {b}?"]


def compare_example(a: int, b: int, phrasing: int) -> Example:
    reasoning, larger = compare_pair_reasoning(a, b)
    smaller = a + b - larger
    if a == b:
        content = f"They are equal: both are {a}."
    elif phrasing == 2:
        content = f"{smaller} is smaller."
    elif phrasing == 3:
        content = f"Yes, {a} is greater than {b}." if larger == a else f"No, {a} is not greater than {b}."
    else:
        content = f"{larger} is larger."
    return Example(task="compare", keys=[f"compare:{a}:{b}"], user=COMPARE_PHRASINGS[phrasing].format(a=a, b=b),
                   turns=[Turn(reasoning, content)], expected={"answer_text": content})


EXTREME_PHRASINGS = ["What is the largest number in {xs}?", "What is the smallest number in {xs}?"]


def extreme_example(xs: list[int], phrasing: int) -> Example:
    want_max = phrasing == 0
    word = "largest" if want_max else "smallest"
    best = xs[0]
    lines = [f"Start with {best}."]
    for x in xs[1:]:
        better = x > best if want_max else x < best
        if better:
            lines.append(f"{x} {'>' if want_max else '<'} {best}, so the {word} so far is {x}.")
            best = x
        else:
            lines.append(f"{x} is not {'larger' if want_max else 'smaller'} than {best}, keep {best}.")
    lines.append(f"The {word} number is {best}.")
    return Example(task="compare", keys=[f"extreme:{phrasing}:{spaced_list(xs)}"],
                   user=EXTREME_PHRASINGS[phrasing].format(xs=spaced_list(xs)),
                   turns=[Turn("\n".join(lines), str(best))], expected={"answer_text": str(best)})


SORT_PHRASINGS = ["Sort these numbers in ascending order: {xs}.", "Sort from smallest to largest: {xs}.",
                  "Sort these numbers in descending order: {xs}.", "Sort from largest to smallest: {xs}."]


def sort_example(xs: list[int], phrasing: int) -> Example:
    descending = phrasing >= 2
    word = "largest" if descending else "smallest"
    remaining, order, lines = list(xs), [], [f"Pick the {word} remaining number each time."]
    while len(remaining) > 1:
        pick = max(remaining) if descending else min(remaining)
        lines.append(f"From {spaced_list(remaining)} the {word} is {pick}.")
        order.append(pick)
        remaining.remove(pick)
    lines.append(f"Only {remaining[0]} is left.")
    order.append(remaining[0])
    lines.append(f"Sorted: {spaced_list(order)}.")
    return Example(task="sort", keys=[f"sort:{int(descending)}:{spaced_list(xs)}"],
                   user=SORT_PHRASINGS[phrasing].format(xs=spaced_list(xs)),
                   turns=[Turn("\n".join(lines), spaced_list(order))], expected={"answer_text": spaced_list(order)})


REVERSE_PHRASINGS = ["Reverse the word '{w}'.", "Write '{w}' backwards.", "What is '{w}' spelled backwards?",
                     "Reverse the letters of '{w}'."]
SPELL_PHRASINGS = ["Spell the word '{w}'.", "How do you spell '{w}'? Letter by letter, please.",
                   "Spell '{w}' with dashes between the letters."]


def reverse_example(word: str, phrasing: int) -> Example:
    letters = ", ".join(word)
    backwards = ", ".join(reversed(word))
    reasoning = f"The letters of '{word}' are: {letters}.\nIn reverse order: {backwards}.\nJoined: {word[::-1]}."
    return Example(task="reverse", keys=[f"reverse:{word}"], user=REVERSE_PHRASINGS[phrasing].format(w=word),
                   turns=[Turn(reasoning, word[::-1])], expected={"answer_text": word[::-1]})


def spell_example(word: str, phrasing: int) -> Example:
    reasoning = f"Split '{word}' into its letters: {', '.join(word)}."
    content = "-".join(word)
    return Example(task="spell", keys=[f"spell:{word}"], user=SPELL_PHRASINGS[phrasing].format(w=word),
                   turns=[Turn(reasoning, content)], expected={"answer_text": content})


# --- Python functions -------------------------------------------------------------------------------------

IS_PRIME_NAMES = ["is_prime", "check_prime", "prime_check", "is_prime_number", "isprime"]
IS_PRIME_PARAMS = ["n", "num", "x", "number", "value"]
IS_PRIME_SIGNATURE_PHRASINGS = [
    "Write a Python function {f}({p}) that returns True if {p} is a prime number and False otherwise.",
    "Implement {f}({p}) in Python: it should return True when {p} is prime.",
    "Give me Python code for a function {f}({p}) that tests whether {p} is prime.",
    "Write a Python function called {f} that takes {p} and checks if it is prime.",
    "Can you write {f}({p}) in Python to check primality?",
    "Please write a Python function {f}({p}) returning whether {p} is prime.",
]
IS_PRIME_PLAIN_PHRASINGS = [
    "Write a Python is_prime function.",
    "Write a Python function to check whether a number is prime.",
    "Can you write a Python is_prime function for me?",
]


def is_prime_code(f: str, p: str, variant: int) -> str:
    if variant == 0:
        return (f"def {f}({p}):\n    if {p} < 2:\n        return False\n    i = 2\n    while i * i <= {p}:\n"
                f"        if {p} % i == 0:\n            return False\n        i += 1\n    return True")
    return (f"def {f}({p}):\n    if {p} < 2:\n        return False\n    for d in range(2, int({p} ** 0.5) + 1):\n"
            f"        if {p} % d == 0:\n            return False\n    return True")


def code_reply(plan: str, code: str, note: str) -> Turn:
    return Turn(plan, f"```python\n{code}\n```\n{note}")


def is_prime_function_example(phrasing: int, f: str, p: str, variant: int) -> Example:
    if phrasing < len(IS_PRIME_SIGNATURE_PHRASINGS):
        user = IS_PRIME_SIGNATURE_PHRASINGS[phrasing].format(f=f, p=p)
    else:
        user = IS_PRIME_PLAIN_PHRASINGS[phrasing - len(IS_PRIME_SIGNATURE_PHRASINGS)]
        f, p = "is_prime", "n"
    plan = (f"Numbers below 2 are not prime. For {p} >= 2, try every divisor d with d * d <= {p}; "
            f"if one divides {p} evenly, {p} is not prime, otherwise it is.")
    turn = code_reply(plan, is_prime_code(f, p, variant),
                      f"`{f}({p})` returns True exactly when {p} is prime.")
    return Example(task="code_is_prime", keys=[f"isprime_fn:{phrasing}:{f}:{p}"], user=user, turns=[turn],
                   expected={"function": f, "kind": "is_prime"})


OTHER_FUNCTIONS = {
    "factorial": (
        ["n", "k", "num"],
        ["Write a Python function {f}({p}) that returns the factorial of {p}.",
         "Implement the factorial {f}({p}) in Python.", "Write a Python factorial function called {f}."],
        "The factorial of {p} is the product 1 * 2 * ... * {p}, and the factorial of 0 is 1. Multiply in a loop.",
        "def {f}({p}):\n    result = 1\n    for i in range(2, {p} + 1):\n        result *= i\n    return result",
        "`{f}({p})` multiplies the numbers from 2 to {p}."),
    "fibonacci": (
        ["n", "k", "i"],
        ["Write a Python function {f}({p}) that returns the {p}-th Fibonacci number.",
         "Implement {f}({p}) in Python, with {f}(0) = 0 and {f}(1) = 1.",
         "Write a Python function called {f} for Fibonacci numbers."],
        "Start from 0 and 1 and step forward {p} times, each time replacing (a, b) by (b, a + b).",
        "def {f}({p}):\n    a, b = 0, 1\n    for _ in range({p}):\n        a, b = b, a + b\n    return a",
        "`{f}(0)` is 0, `{f}(1)` is 1, and each later value is the sum of the two before it."),
    "gcd": (
        ["a, b", "x, y", "m, n"],
        ["Write a Python function {f}({p}) that returns the greatest common divisor.",
         "Implement {f}({p}) in Python using Euclid's algorithm.", "Write a Python gcd function called {f}."],
        "Euclid's algorithm: replace the pair by (second, first mod second) until the second is 0.",
        None,
        "`{f}` uses Euclid's algorithm."),
    "is_palindrome": (
        ["s", "text", "word"],
        ["Write a Python function {f}({p}) that checks whether a string is a palindrome.",
         "Implement {f}({p}) in Python: return True if {p} reads the same backwards.",
         "Write a Python palindrome check called {f}."],
        "A string is a palindrome when it equals its own reverse, and {p}[::-1] reverses it.",
        "def {f}({p}):\n    return {p} == {p}[::-1]",
        "`{f}` compares the string with its reverse."),
    "sum_digits": (
        ["n", "num", "x"],
        ["Write a Python function {f}({p}) that returns the sum of the digits of {p}.",
         "Implement {f}({p}) in Python to add up the decimal digits of a non-negative integer.",
         "Write a Python digit-sum function called {f}."],
        "Take the last digit with % 10, add it, and drop it with // 10 until nothing is left.",
        "def {f}({p}):\n    total = 0\n    while {p} > 0:\n        total += {p} % 10\n        {p} //= 10\n    return total",
        "`{f}` adds the digits one at a time."),
    "count_vowels": (
        ["s", "text", "word"],
        ["Write a Python function {f}({p}) that counts the vowels in a string.",
         "Implement {f}({p}) in Python: return how many of the letters are vowels (a, e, i, o, u).",
         "Write a Python vowel counter called {f}."],
        "Go through the characters and count those that are in 'aeiouAEIOU'.",
        "def {f}({p}):\n    return sum(1 for c in {p} if c in 'aeiouAEIOU')",
        "`{f}` counts both lowercase and uppercase vowels."),
}
OTHER_FUNCTION_NAMES = {
    "factorial": ["factorial", "fact", "compute_factorial"],
    "fibonacci": ["fibonacci", "fib", "nth_fibonacci"],
    "gcd": ["gcd", "greatest_common_divisor", "euclid_gcd"],
    "is_palindrome": ["is_palindrome", "palindrome", "check_palindrome"],
    "sum_digits": ["sum_digits", "digit_sum", "sum_of_digits"],
    "count_vowels": ["count_vowels", "vowel_count", "num_vowels"],
}


def other_function_key(kind: str, phrasing: int, f: str, p: str) -> str:
    """Identity of the prompt: the parameter name only counts where the phrasing shows it."""
    shown = p if "{p}" in OTHER_FUNCTIONS[kind][1][phrasing] else "*"
    return f"fn:{kind}:{phrasing}:{f}:{shown}"


def other_function_example(kind: str, phrasing: int, f: str, p: str) -> Example:
    params, phrasings, plan, code, note = OTHER_FUNCTIONS[kind]
    if kind == "gcd":
        x, y = [s.strip() for s in p.split(",")]
        code = f"def {f}({x}, {y}):\n    while {y} != 0:\n        {x}, {y} = {y}, {x} % {y}\n    return {x}"
    else:
        code = code.format(f=f, p=p)
    user = phrasings[phrasing].format(f=f, p=p)
    turn = code_reply(plan.format(p=p), code, note.format(f=f, p=p))
    return Example(task="code_other", keys=[other_function_key(kind, phrasing, f, p)], user=user, turns=[turn],
                   expected={"function": f, "kind": kind})


# --- Tool use ---------------------------------------------------------------------------------------------

WEATHER_PHRASINGS = ["What's the weather like in {city}?", "Is it raining in {city} right now?",
                     "How warm is it in {city} today?", "Tell me the weather in {city}."]
TIME_PHRASINGS = ["What time is it in {city}?", "Tell me the local time in {city}.", "What's the time in {city} now?"]
CALC_PHRASINGS = ["Use the calculator to compute {a} * {b}.", "What is {a} times {b}?", "Multiply {a} by {b}.",
                  "Calculate {a} × {b} with the calculator."]
SEARCH_PHRASINGS = ["Search the web for {topic}.", "Look up {topic}.", "Find information about {topic}."]
CURRENCY_PHRASINGS = ["Convert {amount} {src} to {dst}.", "How much is {amount} {src} in {dst}?",
                      "What is {amount} {src} worth in {dst}?"]


def tool_subset(rng: random.Random, needed: str) -> list[str]:
    others = [t for t in TOOL_NAMES if t != needed]
    chosen = rng.sample(others, rng.randint(0, 3)) + [needed]
    rng.shuffle(chosen)
    return chosen


def weather_example(rng: random.Random, city: str, phrasing: int) -> Example:
    fahrenheit = rng.random() < 0.25
    arguments = {"city": city, "unit": "fahrenheit"} if fahrenheit else {"city": city}
    user = WEATHER_PHRASINGS[phrasing].format(city=city) + (" Use fahrenheit." if fahrenheit else "")
    temperature = rng.randint(40, 95) if fahrenheit else rng.randint(-10, 35)
    unit = "fahrenheit" if fahrenheit else "celsius"
    condition = rng.choice(CONDITIONS)
    response = json.dumps({"city": city, "temperature": temperature, "unit": unit, "condition": condition})
    symbol = "°F" if fahrenheit else "°C"
    unit_note = " in fahrenheit" if fahrenheit else ""
    first = Turn(f"The user asks about the weather in {city}. The get_weather function gives the current weather, "
                 f"so I call it with city {city}{unit_note}.", "", [tool_call("get_weather", arguments)])
    final = Turn(f"The tool reports {temperature} {unit} and {condition} in {city}. I can answer now.",
                 f"It is currently {temperature} {symbol} and {condition} in {city}.")
    return Example(task="tool", keys=[f"weather:{city}"], user=user, turns=[first, final], tool_responses=[response],
                   tools=tool_subset(rng, "get_weather"),
                   expected={"function": "get_weather", "arguments": arguments})


def time_example(rng: random.Random, city: str, phrasing: int) -> Example:
    clock = f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"
    first = Turn(f"The user wants the local time in {city}. I call get_time with city {city}.", "",
                 [tool_call("get_time", {"city": city})])
    final = Turn(f"The tool says it is {clock} in {city}.", f"It is {clock} in {city}.")
    return Example(task="tool", keys=[f"time:{city}"], user=TIME_PHRASINGS[phrasing].format(city=city),
                   turns=[first, final], tool_responses=[json.dumps({"city": city, "time": clock})],
                   tools=tool_subset(rng, "get_time"), expected={"function": "get_time", "arguments": {"city": city}})


def calculator_example(rng: random.Random, a: int, b: int, phrasing: int) -> Example:
    expression = f"{a} * {b}"
    first = Turn(f"Multiplying {a} by {b} by hand is error-prone. The calculator evaluates it exactly, "
                 f"so I call it with the expression {expression}.", "", [tool_call("calculator", {"expression": expression})])
    final = Turn(f"The calculator returned {a * b}.", f"{a} × {b} = {a * b}.")
    return Example(task="tool", keys=[f"calc:{a}:{b}"], user=CALC_PHRASINGS[phrasing].format(a=a, b=b),
                   turns=[first, final], tool_responses=[json.dumps({"result": a * b})],
                   tools=tool_subset(rng, "calculator"),
                   expected={"function": "calculator", "arguments": {"expression": expression}})


def search_example(rng: random.Random, topic: str, phrasing: int) -> Example:
    first = Turn(f"The user wants information about {topic}. I search the web for it.", "",
                 [tool_call("search_web", {"query": topic})])
    snippet = SEARCH_SNIPPETS[topic]
    final = Turn("The search returned one result. I summarise it.", f"Here is what I found: {snippet}")
    return Example(task="tool", keys=[f"search:{topic}"], user=SEARCH_PHRASINGS[phrasing].format(topic=topic),
                   turns=[first, final], tool_responses=[json.dumps({"results": [snippet]})],
                   tools=tool_subset(rng, "search_web"), expected={"function": "search_web", "arguments": {"query": topic}})


def currency_example(rng: random.Random, amount: int, src: str, dst: str, phrasing: int) -> Example:
    rate = rng.randint(50, 180) / 100
    result = round(amount * rate, 2)
    arguments = {"amount": amount, "from_currency": src, "to_currency": dst}
    first = Turn(f"The user wants to convert {amount} {src} to {dst}. I call convert_currency.", "",
                 [tool_call("convert_currency", arguments)])
    final = Turn(f"The tool converted {amount} {src} to {result} {dst}.", f"{amount} {src} is about {result} {dst}.")
    return Example(task="tool", keys=[f"currency:{amount}:{src}:{dst}"],
                   user=CURRENCY_PHRASINGS[phrasing].format(amount=amount, src=src, dst=dst), turns=[first, final],
                   tool_responses=[json.dumps({"amount": amount, "from": src, "to": dst, "result": result})],
                   tools=tool_subset(rng, "convert_currency"),
                   expected={"function": "convert_currency", "arguments": arguments})


# ----------------------------------------------------------------------------------------------------------
# Held-out split
# ----------------------------------------------------------------------------------------------------------


class Split:
    """Which item keys are held out. Chosen with its own seed so training and evaluation agree."""

    def __init__(self, seed: int):
        rng = random.Random(seed)
        two_digit_pairs = [(a, b) for a in range(10, 100) for b in range(10, 100)]
        self.add_pairs = set(rng.sample(two_digit_pairs, 140))
        self.sub_pairs = set(rng.sample(two_digit_pairs, 140))
        prime_combos = [(n, k) for n in range(2, 100) for k in range(len(PRIME_PHRASINGS))]
        self.prime_combos = set(rng.sample(prime_combos, 90))
        factor_combos = [(n, k) for n in range(4, 100) for k in range(len(FACTOR_PHRASINGS))]
        self.factor_combos = set(rng.sample(factor_combos, 24))
        fn_combos = [(k, f, p) for k in range(len(IS_PRIME_SIGNATURE_PHRASINGS))
                     for f in IS_PRIME_NAMES for p in IS_PRIME_PARAMS]
        self.is_prime_fn_combos = set(rng.sample(fn_combos, 36))
        other_combos = [(kind, k, f, p) for kind, (params, phrasings, *_rest) in sorted(OTHER_FUNCTIONS.items())
                        for k in range(len(phrasings)) for f in OTHER_FUNCTION_NAMES[kind] for p in params]
        self.other_fn_combos = set(rng.sample(other_combos, 24))
        self.word_tasks = set()
        for task in ("reverse", "spell", "letters"):
            self.word_tasks |= {(task, w) for w in rng.sample(WORDS, 24)}
        self.weather_cities = set(rng.sample(CITIES, 10))
        self.time_cities = set(rng.sample(CITIES, 8))
        self.search_topics = set(rng.sample(SEARCH_TOPICS, 6))
        self.calc_pairs = {(rng.randint(11, 99), rng.randint(11, 999)) for _ in range(30)}
        self.sort_items = [(random_list(rng, 3, 6), rng.randrange(len(SORT_PHRASINGS))) for _ in range(12)]
        self.compare_items = [(rng.randint(0, 99), rng.randint(0, 99), rng.randrange(len(COMPARE_PHRASINGS)))
                              for _ in range(8)]
        self.extreme_items = [(random_list(rng, 3, 6), rng.randrange(len(EXTREME_PHRASINGS))) for _ in range(6)]
        self.list_count_items = [(random_list(rng, 2, 8), rng.randrange(len(LIST_COUNT_PHRASINGS))) for _ in range(6)]

    def keys(self) -> set[str]:
        keys = {f"add:{a}:{b}" for a, b in self.add_pairs} | {f"sub:{a}:{b}" for a, b in self.sub_pairs}
        keys |= {f"prime:{n}:{k}" for n, k in self.prime_combos}
        keys |= {f"factor:{n}:{k}" for n, k in self.factor_combos}
        keys |= {f"isprime_fn:{k}:{f}:{p}" for k, f, p in self.is_prime_fn_combos}
        keys |= {other_function_key(kind, k, f, p) for kind, k, f, p in self.other_fn_combos}
        keys |= {f"{task}:{w}" for task, w in self.word_tasks}
        keys |= {f"weather:{c}" for c in self.weather_cities} | {f"time:{c}" for c in self.time_cities}
        keys |= {f"search:{t}" for t in self.search_topics} | {f"calc:{a}:{b}" for a, b in self.calc_pairs}
        keys |= {f"sort:{int(k >= 2)}:{spaced_list(xs)}" for xs, k in self.sort_items}
        keys |= {f"compare:{a}:{b}" for a, b, _k in self.compare_items}
        keys |= {f"extreme:{k}:{spaced_list(xs)}" for xs, k in self.extreme_items}
        keys |= {f"listcount:{spaced_list(xs)}" for xs, _k in self.list_count_items}
        return keys


# ----------------------------------------------------------------------------------------------------------
# Training sampler
# ----------------------------------------------------------------------------------------------------------

TASK_WEIGHTS = [
    ("add", 0.17), ("sub", 0.18), ("brief_add", 0.03), ("prime", 0.12), ("factor", 0.04), ("count", 0.06),
    ("compare", 0.05), ("sort", 0.05), ("reverse", 0.05), ("spell", 0.04), ("code_is_prime", 0.04),
    ("code_other", 0.05), ("tool", 0.10), ("smalltalk", 0.02),
]


def random_list(rng: random.Random, low: int, high: int) -> list[int]:
    return [rng.randint(0, 99) for _ in range(rng.randint(low, high))]


def sample_task(rng: random.Random, task: str) -> Example:
    """One training example of the given task; may use held-out keys (the caller rejects those)."""
    if task in ("add", "sub"):
        r = rng.random()
        if r < 0.75:
            a, b = rng.randint(10, 99), rng.randint(10, 99)
        elif r < 0.9:
            a, b = rng.randint(0, 99), rng.randint(0, 9)
            if rng.random() < 0.5:
                a, b = b, a
        else:
            a, b = rng.randint(0, 9), rng.randint(0, 9)
        phrasings = ADD_PHRASINGS if task == "add" else SUB_PHRASINGS
        return arithmetic_example(task, a, b, rng.randrange(len(phrasings)), brief=rng.random() < 0.2)
    if task == "brief_add":
        return arithmetic_example("add", rng.randint(0, 9), rng.randint(0, 9), rng.choice([0, 1]), brief=True)
    if task == "prime":
        n = rng.randint(0, 99) if rng.random() < 0.05 else rng.randint(2, 99)
        return primality_example(n, rng.randrange(len(PRIME_PHRASINGS)), brief=rng.random() < 0.15)
    if task == "factor":
        return factor_example(rng.randint(2, 99), rng.randrange(len(FACTOR_PHRASINGS)))
    if task == "count":
        kind = rng.randrange(4)
        if kind == 0:
            return letter_count_example(rng.choice(WORDS), rng.randrange(len(LETTER_COUNT_PHRASINGS)))
        if kind == 1:
            word = rng.choice(WORDS)
            letter = rng.choice(word) if rng.random() < 0.8 else rng.choice("abcdefghijklmnopqrstuvwxyz")
            return letter_occurrence_example(word, letter, rng.randrange(len(LETTER_OCCURRENCE_PHRASINGS)))
        if kind == 2:
            return list_count_example(random_list(rng, 2, 8), rng.randrange(len(LIST_COUNT_PHRASINGS)))
        a = rng.randint(0, 90)
        return count_range_example(a, a + rng.randint(2, 12), rng.randrange(len(COUNT_RANGE_PHRASINGS)))
    if task == "compare":
        if rng.random() < 0.6:
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            if rng.random() < 0.3:
                b = (a % 10) * 10 + a // 10 if a >= 10 else a + 10 * rng.randint(1, 9)
            return compare_example(a, b, rng.randrange(len(COMPARE_PHRASINGS)))
        return extreme_example(random_list(rng, 3, 6), rng.randrange(len(EXTREME_PHRASINGS)))
    if task == "sort":
        return sort_example(random_list(rng, 3, 6), rng.randrange(len(SORT_PHRASINGS)))
    if task == "reverse":
        return reverse_example(rng.choice(WORDS), rng.randrange(len(REVERSE_PHRASINGS)))
    if task == "spell":
        return spell_example(rng.choice(WORDS), rng.randrange(len(SPELL_PHRASINGS)))
    if task == "code_is_prime":
        phrasing = rng.randrange(len(IS_PRIME_SIGNATURE_PHRASINGS) + len(IS_PRIME_PLAIN_PHRASINGS))
        return is_prime_function_example(phrasing, rng.choice(IS_PRIME_NAMES), rng.choice(IS_PRIME_PARAMS),
                                         rng.randrange(2))
    if task == "code_other":
        kind = rng.choice(sorted(OTHER_FUNCTIONS))
        params, phrasings, *_rest = OTHER_FUNCTIONS[kind]
        return other_function_example(kind, rng.randrange(len(phrasings)), rng.choice(OTHER_FUNCTION_NAMES[kind]),
                                      rng.choice(params))
    if task == "tool":
        kind = rng.randrange(5)
        if kind == 0:
            return weather_example(rng, rng.choice(CITIES), rng.randrange(len(WEATHER_PHRASINGS)))
        if kind == 1:
            return time_example(rng, rng.choice(CITIES), rng.randrange(len(TIME_PHRASINGS)))
        if kind == 2:
            return calculator_example(rng, rng.randint(11, 99), rng.randint(11, 999), rng.randrange(len(CALC_PHRASINGS)))
        if kind == 3:
            return search_example(rng, rng.choice(SEARCH_TOPICS), rng.randrange(len(SEARCH_PHRASINGS)))
        src, dst = rng.sample(CURRENCIES, 2)
        return currency_example(rng, rng.choice([5, 10, 20, 25, 50, 75, 100, 150, 200, 250, 500, 1000]), src, dst,
                                rng.randrange(len(CURRENCY_PHRASINGS)))
    if task == "smalltalk":
        user, reasoning, content = rng.choice(SMALLTALK)
        return Example(task="smalltalk", keys=[], user=user, turns=[Turn(reasoning, content)])
    raise ValueError(f"unknown task {task!r}")


# ----------------------------------------------------------------------------------------------------------
# Conversation assembly and rendering
# ----------------------------------------------------------------------------------------------------------


def assistant_message(turn: Turn, thinking: bool) -> dict:
    message = {"role": "assistant", "content": turn.content, "reasoning_content": turn.reasoning if thinking else ""}
    if turn.tool_calls:
        message["tool_calls"] = turn.tool_calls
    return message


@dataclass
class Conversation:
    """Messages of one chat; `trained` lists the indices of the assistant messages that carry loss."""

    messages: list[dict]
    tools: list[dict] | None
    thinking: bool
    trained: list[int]
    task: str
    keys: list[str]
    expected: dict


def assemble(example: Example, thinking: bool, system: str | None, history: list[Example]) -> Conversation:
    messages: list[dict] = []
    if system:
        messages.append({"role": "system", "content": system})
    keys = list(example.keys)
    for past in history:
        messages.append({"role": "user", "content": past.user})
        messages.append({"role": "assistant", "content": past.turns[-1].content})
        keys += past.keys
    messages.append({"role": "user", "content": example.user})
    trained = []
    for i, turn in enumerate(example.turns):
        trained.append(len(messages))
        messages.append(assistant_message(turn, thinking))
        if i < len(example.tool_responses):
            messages.append({"role": "tool", "content": example.tool_responses[i]})
    tools = [TOOLS[name] for name in example.tools] if example.tools else None
    return Conversation(messages, tools, thinking, trained, example.task, keys, example.expected)


class Renderer:
    """Renders messages through the chat template the way HF transformers does."""

    def __init__(self, template: str):
        from transformers.utils.chat_template_utils import render_jinja_template

        self._render = render_jinja_template
        self.template = template

    def __call__(self, messages: list[dict], tools, add_generation_prompt: bool, thinking: bool) -> str:
        rendered, _ = self._render(conversations=[messages], tools=tools, chat_template=self.template,
                                   add_generation_prompt=add_generation_prompt, enable_thinking=thinking)
        return rendered[0]


def render_training_record(renderer: Renderer, conv: Conversation) -> dict:
    """Full text plus, for each trained assistant turn, the length in characters of the rendered prompt that
    precedes it (the prompt is that prefix of the text)."""
    text = renderer(conv.messages, conv.tools, add_generation_prompt=False, thinking=conv.thinking)
    prompts = []
    for index in conv.trained:
        prompt = renderer(conv.messages[:index], conv.tools, add_generation_prompt=True, thinking=conv.thinking)
        if not text.startswith(prompt):
            raise ValueError(f"chat template: the generation prompt of turn {index} is not a prefix of the "
                             f"rendered conversation ({conv.task}): {prompt[-80:]!r}")
        prompts.append(prompt)
    user = next(m["content"] for m in reversed(conv.messages) if m["role"] == "user")
    return {"task": conv.task, "keys": conv.keys, "thinking": conv.thinking, "user": user, "text": text,
            "prompt_chars": [len(p) for p in prompts]}


def training_conversation(rng: random.Random, heldout_keys: set[str]) -> Conversation:
    names = [t for t, _ in TASK_WEIGHTS]
    weights = [w for _, w in TASK_WEIGHTS]
    while True:
        example = sample_task(rng, rng.choices(names, weights)[0])
        history = []
        if example.task != "tool" and rng.random() < 0.15:
            for _ in range(rng.randint(1, 2)):
                past_task = rng.choices(names, weights)[0]
                if past_task != "tool":
                    history.append(sample_task(rng, past_task))
        keys = set(example.keys).union(*(h.keys for h in history))
        if keys & heldout_keys:
            continue
        thinking = rng.random() < 0.8
        system = rng.choice(SYSTEM_PROMPTS) if rng.random() < 0.5 else None
        if example.task != "tool" and rng.random() < 0.08:
            # Tools offered but not needed: the model must answer directly.
            example.tools = rng.sample(TOOL_NAMES, rng.randint(1, 3))
        return assemble(example, thinking, system, history)


def _generate_chunk(job: tuple[int, int, str, list[str]]) -> list[dict]:
    seed, count, template, heldout_keys = job
    rng = random.Random(seed)
    renderer = Renderer(template)
    keys = set(heldout_keys)
    return [render_training_record(renderer, training_conversation(rng, keys)) for _ in range(count)]


# ----------------------------------------------------------------------------------------------------------
# Held-out and showcase prompts
# ----------------------------------------------------------------------------------------------------------


def heldout_examples(split: Split, rng: random.Random) -> list[tuple[str, Example, bool]]:
    """(group, example, thinking) for every held-out prompt, in a fixed order."""
    items: list[tuple[str, Example, bool]] = []
    for op, pairs, phrasings in (("add", split.add_pairs, ADD_PHRASINGS), ("sub", split.sub_pairs, SUB_PHRASINGS)):
        ordered = sorted(pairs)
        rng.shuffle(ordered)
        for i, (a, b) in enumerate(ordered[:120]):
            thinking = i < 100
            group = f"{op}2" if thinking else f"{op}2_nothink"
            items.append((group, arithmetic_example(op, a, b, rng.randrange(len(phrasings)), brief=i % 5 == 4),
                          thinking))
    for i, (n, k) in enumerate(sorted(split.prime_combos)):
        thinking = i % 9 != 8
        items.append(("prime" if thinking else "prime_nothink", primality_example(n, k, brief=i % 7 == 6), thinking))
    for n, k in sorted(split.factor_combos):
        items.append(("factor", factor_example(n, k), True))
    for k, f, p in sorted(split.is_prime_fn_combos):
        items.append(("code_is_prime", is_prime_function_example(k, f, p, 0), True))
    for kind, k, f, p in sorted(split.other_fn_combos):
        items.append(("code_other", other_function_example(kind, k, f, p), True))
    for task, word in sorted(split.word_tasks):
        if task == "reverse":
            items.append(("reverse", reverse_example(word, rng.randrange(len(REVERSE_PHRASINGS))), True))
        elif task == "spell":
            items.append(("spell", spell_example(word, rng.randrange(len(SPELL_PHRASINGS))), True))
        else:
            items.append(("count", letter_count_example(word, rng.randrange(len(LETTER_COUNT_PHRASINGS))), True))
    for xs, k in split.sort_items:
        items.append(("sort", sort_example(xs, k), True))
    for a, b, k in split.compare_items:
        items.append(("compare", compare_example(a, b, k), True))
    for xs, k in split.extreme_items:
        items.append(("compare", extreme_example(xs, k), True))
    for xs, k in split.list_count_items:
        items.append(("count", list_count_example(xs, k), True))
    for city in sorted(split.weather_cities):
        items.append(("tool_call", weather_example(rng, city, rng.randrange(len(WEATHER_PHRASINGS))), True))
    for city in sorted(split.time_cities):
        items.append(("tool_call", time_example(rng, city, rng.randrange(len(TIME_PHRASINGS))), True))
    for topic in sorted(split.search_topics):
        items.append(("tool_call", search_example(rng, topic, rng.randrange(len(SEARCH_PHRASINGS))), True))
    for a, b in sorted(split.calc_pairs)[:16]:
        items.append(("tool_call", calculator_example(rng, a, b, rng.randrange(len(CALC_PHRASINGS))), True))
    return items


def heldout_record(renderer: Renderer, split_name: str, index: int, group: str, conv: Conversation,
                   turn_index: int) -> dict:
    """A prompt to generate: everything before the assistant message `conv.trained[turn_index]`."""
    cut = conv.trained[turn_index]
    messages = conv.messages[:cut]
    reference = conv.messages[cut]
    prompt = renderer(messages, conv.tools, add_generation_prompt=True, thinking=conv.thinking)
    return {
        "id": f"{split_name}-{index:04d}",
        "group": group,
        "task": conv.task,
        "keys": conv.keys,
        "thinking": conv.thinking,
        "messages": messages,
        "tools": conv.tools,
        "prompt": prompt,
        "expected": conv.expected,
        "reference": {k: reference[k] for k in ("reasoning_content", "content", "tool_calls") if k in reference},
    }


def build_heldout(split: Split, renderer: Renderer, smoke: bool) -> list[dict]:
    rng = random.Random(CORPUS_SEED + 1)
    records = []
    for group, example, thinking in heldout_examples(split, rng):
        system = rng.choice(SYSTEM_PROMPTS) if rng.random() < 0.4 else None
        history = []
        if group in ("add2", "sub2", "prime") and rng.random() < 0.15:
            history = [sample_task(rng, rng.choice(["spell", "reverse", "count", "smalltalk"]))
                       for _ in range(rng.randint(1, 2))]
            history = [h for h in history if not set(h.keys) & split.keys()]
        conv = assemble(example, thinking, system, history)
        records.append(heldout_record(renderer, "heldout", len(records), group, conv, 0))
        if group == "tool_call" and len(records) % 3 == 0:
            records.append(heldout_record(renderer, "heldout", len(records), "tool_final", conv, 1))
    if smoke:
        by_group: dict[str, list[dict]] = {}
        for r in records:
            by_group.setdefault(r["group"], []).append(r)
        records = [r for group in sorted(by_group) for r in by_group[group][:2]]
    return records


def build_showcase(renderer: Renderer) -> list[dict]:
    """Fixed demo prompts that ARE in the training distribution (some verbatim); not a held-out measure."""
    examples = [
        ("brief", arithmetic_example("add", 2, 2, 0, brief=True), True, None),
        ("brief", arithmetic_example("add", 2, 2, 0, brief=True), False, None),
        ("add2", arithmetic_example("add", 47, 38, 1, brief=False), True, "You are a helpful assistant."),
        ("sub2", arithmetic_example("sub", 82, 37, 1, brief=False), True, None),
        ("prime", primality_example(91, 0, brief=False), True, None),
        ("code_is_prime", is_prime_function_example(len(IS_PRIME_SIGNATURE_PHRASINGS), "is_prime", "n", 0), True, None),
        ("reverse", reverse_example("planet", 0), True, None),
    ]
    records = []
    for group, example, thinking, system in examples:
        conv = assemble(example, thinking, system, [])
        records.append(heldout_record(renderer, "showcase", len(records), group, conv, 0))
    weather = weather_example(random.Random(7), "Paris", 0)
    conv = assemble(weather, True, None, [])
    records.append(heldout_record(renderer, "showcase", len(records), "tool_call", conv, 0))
    return records


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="training corpus JSONL to write")
    parser.add_argument("--num-train", type=int, default=250_000)
    parser.add_argument("--workers", type=int, default=max(1, (multiprocessing.cpu_count() or 2) - 1))
    parser.add_argument("--smoke", action="store_true", help="tiny corpus and a reduced held-out set")
    parser.add_argument("--heldout-out", type=Path, default=HELDOUT_PATH)
    parser.add_argument("--showcase-out", type=Path, default=SHOWCASE_PATH)
    args = parser.parse_args(argv)
    if args.smoke:
        args.num_train = min(args.num_train, 1500)
        if args.heldout_out == HELDOUT_PATH:
            args.heldout_out = args.out.parent / "heldout.jsonl"
        if args.showcase_out == SHOWCASE_PATH:
            args.showcase_out = args.out.parent / "showcase.jsonl"

    if not CHAT_TEMPLATE_PATH.exists():
        print(f"error: chat template not found at {CHAT_TEMPLATE_PATH}", file=sys.stderr)
        return 1
    template = CHAT_TEMPLATE_PATH.read_text(encoding="utf-8")
    renderer = Renderer(template)
    split = Split(CORPUS_SEED)
    heldout_keys = split.keys()

    heldout = build_heldout(split, renderer, smoke=args.smoke)
    write_jsonl(args.heldout_out, heldout)
    write_jsonl(args.showcase_out, build_showcase(renderer))

    chunk = 2000
    jobs = [(CORPUS_SEED * 1000 + i, min(chunk, args.num_train - start), template, sorted(heldout_keys))
            for i, start in enumerate(range(0, args.num_train, chunk))]
    if args.workers > 1 and len(jobs) > 1:
        with multiprocessing.Pool(args.workers) as pool:
            chunks = pool.map(_generate_chunk, jobs)
    else:
        chunks = [_generate_chunk(job) for job in jobs]
    records = [r for c in chunks for r in c]

    heldout_prompts = {r["messages"][-1]["content"] for r in heldout if r["messages"][-1]["role"] == "user"}
    leaked = sum(1 for r in records if set(r["keys"]) & heldout_keys or r["user"] in heldout_prompts)
    if leaked:
        raise RuntimeError(f"{leaked} training conversations use held-out keys or prompts")
    write_jsonl(args.out, records)

    digest = hashlib.sha256(args.heldout_out.read_bytes()).hexdigest()[:16]
    counts: dict[str, int] = {}
    for r in records:
        counts[r["task"]] = counts.get(r["task"], 0) + 1
    print(f"wrote {len(records)} training conversations to {args.out}")
    print(f"  tasks: {json.dumps(dict(sorted(counts.items())))}")
    print(f"wrote {len(heldout)} held-out prompts ({len(heldout_prompts)} distinct final user texts) to "
          f"{args.heldout_out} sha256:{digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
