#!/usr/bin/env python3
"""Writes the labelled degeneration corpus, tests/data/degeneration/corpus.jsonl.

Each line: {"id", "label": "healthy"|"degenerate", "kind" (degenerate only), "text", "note"}.
Healthy items repeat things legitimately (tables, lists, code, counting, refrains, logs, closed
reasoning); degenerate items loop, babble or reason without end, as a broken forward pass does
(docs/serving.md, "The founding failure"); the `*-short-*` items are replies of a few hundred bytes,
the size a small max_tokens leaves, on both sides. Long hand-written texts live in tests/data/degeneration/sources/
(sections opened by "@@@ name :: note"); short lists and the generators are below. Variations are drawn
with a fixed seed, so the output is reproducible:

    python3 scripts/make_degeneration_corpus.py            # rewrite the corpus
    python3 scripts/make_degeneration_corpus.py --check    # fail if the committed file differs

Only the standard library is used.
"""

import argparse
import json
import pathlib
import random
import sys

DATA = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "degeneration"
OUT = DATA / "corpus.jsonl"


def read_sections(name):
    """Sections of a source file: '@@@ name :: note' then the text up to the next marker."""
    sections = {}
    current = None
    for line in (DATA / "sources" / name).read_text(encoding="utf-8").splitlines(keepends=True):
        if line.startswith("@@@ "):
            key, note = line[4:].rstrip("\n").split(" :: ", 1)
            assert key not in sections, key
            current = sections[key] = [note, ""]
        else:
            current[1] += line
    return {key: (note, text.strip("\n")) for key, (note, text) in sections.items()}


# ---------------------------------------------------------------- short lists

COUNTRIES = [("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
             ("Portugal", "Lisbon"), ("Poland", "Warsaw"), ("Sweden", "Stockholm"), ("Norway", "Oslo"),
             ("Finland", "Helsinki"), ("Greece", "Athens"), ("Egypt", "Cairo"), ("Kenya", "Nairobi"),
             ("Nigeria", "Abuja"), ("Japan", "Tokyo"), ("India", "New Delhi"), ("China", "Beijing"),
             ("Brazil", "Brasília"), ("Argentina", "Buenos Aires"), ("Canada", "Ottawa"), ("Mexico", "Mexico City"),
             ("Australia", "Canberra"), ("Chile", "Santiago"), ("Peru", "Lima"), ("Vietnam", "Hanoi")]
FIRST_NAMES = ["Alice", "Bob", "Carla", "Deepak", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kemi",
               "Liam", "Maya", "Nikolai", "Olga", "Pedro", "Quinn", "Rosa", "Sven", "Tara", "Umar", "Vera",
               "Wen", "Ximena", "Yusuf", "Zoe"]
CITIES = ["Lisbon", "Porto", "Lyon", "Turin", "Krakow", "Ghent", "Bergen", "Tartu", "Graz", "Seville",
          "Utrecht", "Aarhus", "Leipzig", "Bologna", "Zagreb"]
TIPS = ["Go to bed at the same time every night.", "Keep your bedroom cool and dark.",
        "Avoid caffeine after 2 pm.", "Put your phone in another room.", "Get daylight in the morning.",
        "Exercise, but not right before bed.", "Keep naps under 30 minutes.", "Avoid heavy meals late at night.",
        "Limit alcohol in the evening.", "Use the bed only for sleep.", "Write down tomorrow's tasks before bed.",
        "Try a short breathing exercise.", "Keep a consistent wake-up time at weekends.",
        "Use earplugs if your street is noisy.", "See a doctor if you snore loudly."]
OPCODES = ["nop", "load", "store", "add", "sub", "mul", "div", "and", "or", "xor", "not", "shl", "shr",
           "jmp", "jz", "jnz", "call", "ret", "push", "pop", "halt"]
TREE_LINES = ["project/", "├── Cargo.toml", "├── README.md", "├── src/", "│   ├── main.rs", "│   ├── lib.rs",
              "│   ├── config.rs", "│   └── server/", "│       ├── mod.rs", "│       ├── routes.rs",
              "│       └── handlers.rs", "├── tests/", "│   ├── api.rs", "│   └── fixtures/",
              "│       ├── small.json", "│       └── large.json", "└── scripts/", "    └── release.sh"]
CHESS_ROWS = [list("rnbqkbnr"), list("pppppppp"), list("        "), list("        "), list("        "),
              list("        "), list("PPPPPPPP"), list("RNBQKBNR")]


def roman(n):
    out = ""
    for value, symbol in ((50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")):
        while n >= value:
            out += symbol
            n -= value
    return out


OPENINGS = [
    "Sure! Let me help you with that.",
    "Great question. Here is a detailed explanation.",
    "To answer this, we need to look at the problem step by step.",
    "Here is the summary you asked for.",
    "The short answer is yes, but there are some caveats.",
    "Okay, let's work through this together.",
    "Thanks for the context. Based on what you described,",
    "First, some background on how the system works.",
    "I checked the numbers you sent.",
    "This is a common source of confusion.",
    "Let me start with the definition.",
    "You are right that the documentation is unclear here.",
    "Here is a draft of the email.",
    "The error message points to a missing dependency.",
    "Good morning! Here is today's plan.",
]

LOOP_PHRASES = ["I'm sorry, ", "Let me check. ", "the answer is ", "of the ", "and then ", "Thank you! ",
                "is ", "So, ", "Wait, ", "I think ", "= ", "**Answer:** ", "Hmm... ", "again and ",
                "yes, ", "No no no ", "OK. ", "我们", "答案是", "Let's see, ", "1 + 1 = 2, ", "etc. "]

LOOP_SENTENCES = [
    "The answer is 4.",
    "I hope this helps!",
    "Let me know if you have any other questions.",
    "Therefore, the final answer is 42.",
    "This is because the function returns None when the list is empty.",
    "We can see that the value of x is 5.",
    "Please note that this information may be outdated.",
    "The capital of France is Paris, which is known for the Eiffel Tower.",
    "To verify, we substitute x = 3 back into the equation and get 9 = 9.",
    "Let's double-check the calculation: 12 * 12 = 144.",
    "You can install the package with pip install requests.",
    "In conclusion, regular exercise is good for your health.",
    "The meeting has been moved to Thursday at 3 pm.",
    "The quick brown fox jumps over the lazy dog.",
    "I will now provide the code for the solution.",
    "这个问题的答案是四。",
]

CODE_LOOPS = [
    ("the same import line", "```python\n", "import numpy as np\n", 120),
    ("closing braces forever", "function f() {\n  if (x) {\n    return 1;\n", "    }\n", 300),
    ("closing div tags", "<div class=\"container\">\n  <p>Hello</p>\n", "</div>", 300),
    ("the same print line", "```python\n", "print(\"Hello, World!\")\n", 100),
    ("the same JSON object", "[\n", "  {\"id\": 1, \"name\": \"Alice\", \"active\": true},\n", 80),
    ("the same table row", "| id | name | age |\n|---|---|---|\n", "| 1 | Alice | 30 |\n", 100),
    ("return x forever", "def f(x):\n", "    return x\n", 150),
    ("x = x + 1 forever", "x = 0\n", "x = x + 1\n", 150),
    ("else: pass blocks", "if a:\n    pass\n", "else:\n    pass\n", 120),
    ("the same SQL query", "```sql\n", "SELECT * FROM users WHERE id = 1;\n", 60),
    ("the same TODO comment", "fn main() {\n", "    // TODO: implement this\n", 80),
    ("a zero array that never ends", "data = [", "0, ", 1000),
]

BABBLE_VOCABS = [
    ["prime", "prime", "prime", "primes", "number", "numbers"],
    ["the", "the", "of", "and", "a", "the"],
    ["yes", "no", "no", "yes", "maybe"],
    ["I", "I", "think", "I", "the"],
    ["answer", "answer", "is", "the", "answer"],
    ["的", "的", "是", "了", "的"],
    ["sorry", "sorry", "I'm", "so", "sorry"],
    ["check", "again", "check", "verify", "again", "check"],
    ["hello", "hello", "hi", "hello", "hey"],
    ["Paris", "France", "capital", "Paris", "the", "is"],
    ["function", "return", "function", "value", "return"],
    ["😂", "😂", "🤣", "😂"],
]

VARIED_LOOPS = [
    ("The answer is {}.", [["4", "four", "4", "2"]]),
    ("Let me {} the {} again.", [["check", "verify", "recheck"], ["answer", "result", "calculation"]]),
    ("I {} sorry for the {}.", [["am", "'m really", "am very"], ["confusion", "mistake", "error"]]),
    ("So {} + {} = {}.", [["2", "two"], ["2", "two"], ["4", "2", "22"]]),
    ("The capital of France is {}, {}.", [["Paris", "Paris", "paris"], ["which is correct", "right", "yes"]]),
    ("We need to find the {} of the {}.", [["sum", "total", "value"], ["numbers", "two numbers", "inputs"]]),
    ("Step {}: add the numbers.", [["1", "2", "1", "3"]]),
    ("Therefore, the {} is {}.", [["result", "answer", "final answer"], ["4", "four"]]),
    ("Wait, {} {}.", [["let me", "I should", "maybe I should"], ["check again", "recheck", "verify this"]]),
    ("{} is a prime number.", [["2", "3", "5", "7", "2", "3"]]),
    ("我们需要计算{}。", [["二加二", "2+2", "这个"]]),
    ("Hmm, {} {} {}.", [["that", "this", "it"], ["is", "seems", "looks"], ["right", "wrong", "correct", "odd"]]),
]


def rambling_reasoning(rng, family):
    """Reasoning that wanders without reaching an answer or a </think>: varied, not periodic."""
    target = rng.randint(5200, 7200)
    parts = []
    if family % 4 == 0:
        n = rng.randint(1000, 9000) * 4 + 3  # 3 mod 4: never a sum of two squares
        parts.append(f"We need integers x and y with x^2 + y^2 = {n}. Let me search.")
        x = rng.randint(1, 9)
        while sum(map(len, parts)) < target:
            rest = n - x * x
            if rest < 0:
                parts.append(f"x = {x} is too big, {x * x} > {n}. Let me restart from a different angle.")
                x = rng.randint(1, 20)
                continue
            s = int(rest ** 0.5)
            parts.append(rng.choice([
                f"Try x = {x}: y^2 = {n} - {x * x} = {rest}. {s}^2 = {s * s} and {s + 1}^2 = {(s + 1) ** 2}, so no.",
                f"x = {x} gives {rest}, which lies between {s * s} and {(s + 1) ** 2}. Not a square.",
                f"With x = {x}, the remainder is {rest}; the nearest square below is {s * s}. Doesn't work.",
            ]))
            if rng.random() < 0.15:
                parts.append(rng.choice([
                    "Hmm, maybe there is a smarter way using the factorisation.",
                    f"Wait, {n} is odd, so one of x, y is even and the other odd. That doesn't rule much out.",
                    "Let me keep going a bit longer before switching methods.",
                    f"Maybe I made an arithmetic slip earlier; {x - 1}^2 = {(x - 1) ** 2}, that was right.",
                    "Actually, I'm not sure the search will terminate quickly, but let me continue.",
                ]))
            x += rng.choice([1, 1, 1, 2, 3])
    elif family % 4 == 1:
        year = rng.randint(1700, 2100)
        month = rng.randint(1, 12)
        day = rng.randint(1, 28)
        parts.append(f"What day of the week was {day}/{month}/{year}? Let me compute it in several ways.")
        while sum(map(len, parts)) < target:
            ref = rng.randint(1800, 2050)
            diff = year - ref
            leaps = diff // 4 - diff // 100 + diff // 400
            shift = (diff + leaps) % 7
            parts.append(rng.choice([
                f"Take {ref} as a reference. The difference is {diff} years with about {leaps} leap years, "
                f"so the shift is ({diff} + {leaps}) mod 7 = {shift}.",
                f"From 1 January {ref}: {diff} years and {leaps} leap days give a shift of {shift} weekdays.",
                f"Counting from {ref}, {diff} * 365 = {diff * 365} days plus {leaps}, modulo 7 that is {shift}.",
            ]))
            parts.append(rng.choice([
                f"But I don't remember which weekday 1 January {ref} was. Maybe a {rng.choice(['Monday', 'Tuesday', 'Friday', 'Sunday'])}?",
                f"The month offset for month {month} is {rng.randint(0, 6)} if I recall the table, then add the day {day}.",
                f"Hmm, the leap year rule for {ref + rng.randint(0, 99)} needs checking too.",
                "I am not confident in the doomsday anchors, so let me try yet another reference year.",
                f"Zeller's congruence: h = (q + 13(m+1)/5 + K + K/4 + J/4 + 5J) mod 7 with q = {day}.",
            ]))
    elif family % 4 == 2:
        word = rng.choice(["listen", "garden", "master", "danger", "silent", "reason", "thread", "planet"])
        parts.append(f"I need an anagram of '{word}' that is also a common English word. Let me try arrangements.")
        letters = list(word)
        while sum(map(len, parts)) < target:
            rng.shuffle(letters)
            guess = "".join(letters)
            parts.append(rng.choice([
                f"Maybe '{guess}'? No, that is not a word.",
                f"What about '{guess}'? I don't think so.",
                f"'{guess}' - not a word either.",
                f"Could it be '{guess[:3]}' plus '{guess[3:]}'? That doesn't make sense.",
            ]))
            if rng.random() < 0.2:
                parts.append(rng.choice([
                    f"Let me think about common endings: -er, -en, -ed, -ing. The letters of '{word}' allow some of those.",
                    f"Maybe I should fix the first letter as '{rng.choice(word)}' and permute the rest.",
                    "There are 720 permutations, which is a lot to check by hand.",
                    "I feel like I'm missing something obvious.",
                ]))
    else:
        topics = ["the budget", "the schedule", "the user's tone", "the data format", "the deadline",
                  "the team size", "the risk of delays", "the first draft", "the client's feedback", "the pricing",
                  "the target audience", "the launch date", "the marketing plan", "the technical debt",
                  "the hiring plan", "the quarterly goals", "the onboarding flow", "the error budget"]
        verbs = ["reconsider", "look again at", "think more about", "revisit", "question", "set aside",
                 "come back to", "weigh", "compare", "rethink"]
        linkers = ["Actually,", "Hmm,", "On the other hand,", "Alternatively,", "But then again,", "Wait,",
                   "Also,", "Maybe", "I wonder whether", "Perhaps"]
        parts.append("The user wants a plan for the product launch. Let me think about what matters most.")
        while sum(map(len, parts)) < target:
            a, b = rng.sample(topics, 2)
            parts.append(f"{rng.choice(linkers)} I should {rng.choice(verbs)} {a} before {b}, "
                         f"since {a} affects {b} in week {rng.randint(1, 12)} and costs about {rng.randint(2, 40)} thousand.")
    return " ".join(parts)


ITEMS = []


def add(item_id, label, text, note, kind=None):
    assert label in ("healthy", "degenerate")
    assert (kind is None) == (label == "healthy"), item_id
    item = {"id": item_id, "label": label}
    if kind:
        item["kind"] = kind
    item["text"] = text
    item["note"] = note
    ITEMS.append(item)


def cut(text, length):
    """A loop cut by max_tokens: the text up to `length` characters."""
    return text[:length]


# ---------------------------------------------------------------- healthy


def healthy_hand_written():
    for name, (note, text) in read_sections("healthy.txt").items():
        add(f"healthy-{name}", "healthy", text + "\n", note)


def healthy_tables(rng):
    products = ["Laptop A14", "Laptop B15", "Ultrabook C13", "Workstation D17", "Chromebook E11",
                "Tablet F10", "Convertible G14", "Gaming H16"]
    rows = []
    for p in products:
        rows.append(f"| {p} | {rng.choice([8, 16, 32, 64])} GB | {rng.choice([256, 512, 1024, 2048])} GB | "
                    f"{rng.randint(9, 22)} h | ${rng.randint(499, 2899)} |")
    add("healthy-table-laptops", "healthy",
        "Here is a comparison of the models you listed:\n\n| Model | RAM | Storage | Battery | Price |\n"
        "|-------|-----|---------|---------|-------|\n" + "\n".join(rows) +
        "\n\nThe Ultrabook C13 offers the best balance of battery life and price.\n",
        "markdown table of similar rows, numbers vary")

    features = ["Dark mode", "Offline sync", "Two-factor login", "Export to PDF", "Custom themes",
                "API access", "Single sign-on", "Audit log", "Team folders", "Version history",
                "Mobile app", "Keyboard shortcuts", "Webhooks", "Data residency", "Priority support"]
    lines = ["| Feature | Free | Pro | Team | Enterprise |", "|---|---|---|---|---|"]
    for i, f in enumerate(features):
        cells = ["Yes" if (i + k) % 4 != 0 and k >= i % 3 else "No" for k in range(4)]
        lines.append(f"| {f} | " + " | ".join(cells) + " |")
    add("healthy-table-yes-no", "healthy",
        "Plan comparison:\n\n" + "\n".join(lines) + "\n\nAll plans include unlimited projects.\n",
        "15-row feature matrix of Yes/No cells: low vocabulary, but each row has its own name")

    lines = ["| Check | Linux | macOS | Windows |", "|:--|:-:|:-:|:-:|"]
    checks = ["build", "unit tests", "integration tests", "lint", "format", "docs", "benchmarks",
              "fuzzing", "miri", "coverage", "release build", "packaging", "signing", "smoke test",
              "install script", "uninstall script", "upgrade path", "license scan", "audit", "size check"]
    for c in checks:
        lines.append(f"| {c} | " + " | ".join(rng.choice(["✅", "✅", "✅", "❌"]) for _ in range(3)) + " |")
    add("healthy-table-checkmarks", "healthy",
        "CI status per platform:\n\n" + "\n".join(lines) + "\n",
        "20-row table of check marks: symbolic cells repeat, row names differ")

    days = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]
    slots = ["08:00", "09:30", "11:00", "13:30", "15:00", "16:30"]
    subjects = ["Math", "Physics", "History", "English", "Chemistry", "Art", "Music", "Biology", "PE"]
    lines = ["| Time | " + " | ".join(days) + " |", "|" + "---|" * (len(days) + 1)]
    for s in slots:
        lines.append(f"| {s} | " + " | ".join(rng.choice(subjects) for _ in days) + " |")
    add("healthy-table-timetable", "healthy",
        "Your weekly timetable:\n\n" + "\n".join(lines) + "\n\nLunch is from 12:30 to 13:30 every day.\n",
        "timetable: the same few subjects recur in every row")

    lines = ["| Country | Capital | Population (M) | Area (km²) |", "|---|---|---|---|"]
    for country, capital in COUNTRIES:
        lines.append(f"| {country} | {capital} | {rng.randint(2, 340)} | {rng.randint(20, 9800) * 1000:,} |")
    add("healthy-table-countries", "healthy", "\n".join(lines) + "\n",
        "long markdown table, one row per country")

    lines = ["+----+------------+-------+---------+", "| id | name       | score | passed  |",
             "+----+------------+-------+---------+"]
    for i in range(1, 26):
        name = rng.choice(FIRST_NAMES)
        score = rng.randint(40, 100)
        lines.append(f"| {i:>2} | {name:<10} | {score:>5} | {'true' if score >= 60 else 'false':<7} |")
    lines.append("+----+------------+-------+---------+")
    add("healthy-table-sql-result", "healthy",
        "mysql> SELECT id, name, score, score >= 60 AS passed FROM results;\n" + "\n".join(lines) +
        "\n25 rows in set (0.01 sec)\n", "ASCII SQL result table: borders repeat, ids increment")

    elements = [("H", "Hydrogen", 1.008), ("He", "Helium", 4.0026), ("Li", "Lithium", 6.94),
                ("Be", "Beryllium", 9.0122), ("B", "Boron", 10.81), ("C", "Carbon", 12.011),
                ("N", "Nitrogen", 14.007), ("O", "Oxygen", 15.999), ("F", "Fluorine", 18.998),
                ("Ne", "Neon", 20.180), ("Na", "Sodium", 22.990), ("Mg", "Magnesium", 24.305),
                ("Al", "Aluminium", 26.982), ("Si", "Silicon", 28.085), ("P", "Phosphorus", 30.974),
                ("S", "Sulfur", 32.06), ("Cl", "Chlorine", 35.45), ("Ar", "Argon", 39.95)]
    lines = ["| Z | Symbol | Name | Atomic mass |", "|---|---|---|---|"]
    for z, (sym, name, mass) in enumerate(elements, 1):
        lines.append(f"| {z} | {sym} | {name} | {mass} |")
    add("healthy-table-elements", "healthy", "The first 18 elements:\n\n" + "\n".join(lines) + "\n",
        "table with incrementing atomic numbers")


def healthy_lists(rng):
    tips = TIPS[:]
    for n, k in enumerate((8, 12, 15)):
        rng.shuffle(tips)
        body = "\n".join(f"{i}. {t}" for i, t in enumerate(tips[:k], 1))
        add(f"healthy-numbered-tips-{n}", "healthy",
            f"Here are {k} tips for better sleep:\n\n{body}\n\nTry a few at a time and see what works.\n",
            "numbered list 1. 2. 3. with different items")
    steps = ["Open Settings.", "Go to Network.", "Select Wi-Fi.", "Choose your network.",
             "Enter the password.", "Click Connect.", "Wait for the status to show Connected.",
             "Open a browser to check the connection.", "If it fails, restart the router.",
             "Try again after two minutes."]
    add("healthy-steps-wifi", "healthy",
        "To connect to Wi-Fi:\n\n" + "\n".join(f"Step {i}: {s}" for i, s in enumerate(steps, 1)) + "\n",
        "Step 1: ... Step 10: list, the prefix repeats, the content differs")
    chores = ["water the plants", "take out the recycling", "vacuum the living room", "clean the bathroom",
              "do the laundry", "change the bed sheets", "wipe the kitchen counters", "sort the mail",
              "walk the dog", "buy groceries", "pay the electricity bill", "call the plumber"]
    add("healthy-checklist", "healthy",
        "Weekend checklist:\n\n" + "\n".join(f"- [{'x' if rng.random() < 0.5 else ' '}] {c}" for c in chores) + "\n",
        "markdown checklist with repeated box markup")


def healthy_code(rng):
    add("healthy-code-array-assign", "healthy",
        "Here is the unrolled initialisation:\n\n```c\n" +
        "".join(f"x[{i}] = {i};\n" for i in range(48)) + "```\n",
        "x[0] = 0; x[1] = 1; ... 48 similar lines, indices increment")
    add("healthy-code-squares-assign", "healthy",
        "```python\nsquares = {}\n" + "".join(f"squares[{i}] = {i * i}\n" for i in range(1, 41)) + "```\n",
        "dict assignments with increasing values")
    lines = []
    for n in range(2, 60):
        is_p = all(n % d for d in range(2, int(n ** 0.5) + 1))
        lines.append(f"    assert is_prime({n}) is {is_p}")
    add("healthy-code-assert-lines", "healthy",
        "```python\ndef test_is_prime():\n" + "\n".join(lines) + "\n```\n",
        "58 repeated assert lines with different arguments")
    cases = [("empty", '""', "0"), ("single", '"a"', "1"), ("spaces", '"a b"', "2"), ("tabs", '"a\\tb"', "2"),
             ("newline", '"a\\nb"', "2"), ("unicode", '"héllo wörld"', "2"), ("punct", '"a, b; c"', "3"),
             ("many", '"one two three four five"', "5"), ("lead", '"  x"', "1"), ("trail", '"x  "', "1")]
    body = "\n\n".join(f"def test_word_count_{name}():\n    assert word_count({arg}) == {out}" for name, arg, out in cases)
    add("healthy-code-test-functions", "healthy", "```python\n" + body + "\n```\n",
        "ten tiny test functions of the same shape")
    names = FIRST_NAMES[:]
    rng.shuffle(names)
    rows = "\n".join(f"    <tr><td>{n}</td><td>{rng.randint(18, 70)}</td><td>{rng.choice(CITIES)}</td></tr>"
                     for n in names[:20])
    add("healthy-code-html-rows", "healthy",
        "```html\n<table>\n  <thead>\n    <tr><th>Name</th><th>Age</th><th>City</th></tr>\n  </thead>\n  <tbody>\n"
        + rows + "\n  </tbody>\n</table>\n```\n", "HTML table rows with the same tags")
    week = "<tr>" + "<td></td>" * 7 + "</tr>"
    add("healthy-code-html-empty-calendar", "healthy",
        "An empty month grid you can fill in:\n\n```html\n<table class=\"calendar\">\n  <tr><th>Mon</th><th>Tue</th>"
        "<th>Wed</th><th>Thu</th><th>Fri</th><th>Sat</th><th>Sun</th></tr>\n" +
        "".join(f"  {week}\n" for _ in range(6)) + "</table>\n```\n",
        "six identical empty rows: exact repetition, but bounded")
    values = ", ".join(f"({i}, '{rng.choice(FIRST_NAMES)}', '{rng.choice(CITIES)}', {rng.randint(1000, 9000)})"
                       for i in range(1, 31))
    add("healthy-code-sql-insert", "healthy",
        "```sql\nINSERT INTO customers (id, name, city, credit) VALUES\n" + values.replace("), (", "),\n(") + ";\n```\n",
        "30 value tuples of the same shape")
    inserts = "\n".join(f"INSERT INTO events (ts, kind) VALUES ('2024-03-{d:02d} 10:00:00', 'daily_check');"
                        for d in range(1, 29))
    add("healthy-code-sql-identical-but-dates", "healthy", "```sql\n" + inserts + "\n```\n",
        "28 INSERT statements that differ only in the date")
    add("healthy-code-enum-match", "healthy",
        "```rust\nfn opcode_name(op: u8) -> &'static str {\n    match op {\n" +
        "".join(f"        0x{i:02X} => \"{name}\",\n" for i, name in enumerate(OPCODES)) +
        "        _ => \"unknown\",\n    }\n}\n```\n", "match arms of the same shape")


def healthy_counting(rng):
    add("healthy-count-1-50", "healthy",
        "Sure, here are the numbers from 1 to 50:\n\n" + ", ".join(str(i) for i in range(1, 51)) + "\n",
        "counting sequence 1, 2, ..., 50")
    add("healthy-count-1-200-lines", "healthy", "\n".join(str(i) for i in range(1, 201)) + "\n",
        "counting to 200, one number per line")
    add("healthy-count-evens", "healthy",
        "Even numbers up to 200: " + " ".join(str(i) for i in range(2, 201, 2)) + ".\n", "even numbers")
    add("healthy-countdown", "healthy",
        "Countdown: " + ", ".join(str(i) for i in range(100, 0, -1)) + "... liftoff!\n", "countdown from 100")
    for n in (7, 9, 12):
        add(f"healthy-times-table-{n}", "healthy",
            f"The {n} times table:\n\n" + "\n".join(f"{n} x {i} = {n * i}" for i in range(1, 21)) + "\n",
            "multiplication table: the same shape every line, numbers change")
    grid = "\n".join(" ".join(f"{a * b:>3}" for b in range(1, 13)) for a in range(1, 13))
    add("healthy-times-grid", "healthy", "Multiplication grid 1-12:\n\n```\n" + grid + "\n```\n",
        "12x12 multiplication grid")
    add("healthy-powers-of-two", "healthy",
        "\n".join(f"2^{i} = {2 ** i}" for i in range(0, 64)) + "\n", "powers of two")
    fib = [0, 1]
    while len(fib) < 60:
        fib.append(fib[-1] + fib[-2])
    add("healthy-fibonacci", "healthy",
        "The first 60 Fibonacci numbers are: " + ", ".join(map(str, fib)) + ".\n", "Fibonacci sequence")
    primes = [n for n in range(2, 1000) if all(n % d for d in range(2, int(n ** 0.5) + 1))]
    add("healthy-primes-list", "healthy",
        "The primes below 1000 are:\n\n" + ", ".join(map(str, primes)) + "\n\nThere are 168 of them.\n",
        "list of primes: 'prime' topic without the loop")
    add("healthy-binary-counting", "healthy",
        "Binary counting from 0 to 63:\n\n" + "\n".join(f"{i:>2} = {i:06b}" for i in range(64)) + "\n",
        "binary numbers: zeros and ones, incrementing")
    add("healthy-hex-table", "healthy",
        "Printable ASCII:\n\n" + "\n".join(f"0x{i:02X}  {i:>3}  {chr(i)!r}" for i in range(32, 127)) + "\n",
        "ASCII table")
    ones = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
            "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
    tens = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]

    def words(n):
        if n < 20:
            return ones[n]
        return tens[n // 10] + ("" if n % 10 == 0 else "-" + ones[n % 10])
    add("healthy-count-in-words", "healthy",
        "Counting in words: " + ", ".join(words(i) for i in range(1, 100)) + ".\n",
        "counting in words: twenty-one, twenty-two, ... the tens word repeats")
    add("healthy-roman-numerals", "healthy",
        "\n".join(f"{i}: {roman(i)}" for i in range(1, 61)) + "\n", "roman numerals I to LX")
    add("healthy-squares-cubes", "healthy",
        "| n | n² | n³ |\n|---|---|---|\n" + "\n".join(f"| {i} | {i * i} | {i ** 3} |" for i in range(1, 41)) + "\n",
        "table of squares and cubes")


def healthy_data(rng):
    users = [{"id": i, "name": rng.choice(FIRST_NAMES), "email": f"user{i}@example.com",
              "active": rng.random() < 0.7, "role": rng.choice(["admin", "editor", "viewer", "viewer"])}
             for i in range(1, 21)]
    add("healthy-json-users", "healthy", "```json\n" + json.dumps(users, indent=2) + "\n```\n",
        "JSON array of 20 similar objects")
    flags = [{"id": i, "status": "active", "region": "eu-west-1", "retries": 3} for i in range(1, 31)]
    add("healthy-json-same-but-id", "healthy", json.dumps(flags, indent=2) + "\n",
        "30 JSON objects identical except their id: hard case")
    features = [{"type": "Feature", "geometry": {"type": "Point", "coordinates": [round(rng.uniform(-10, 30), 4),
                 round(rng.uniform(35, 60), 4)]}, "properties": {"name": c}} for c in CITIES[:12]]
    add("healthy-geojson", "healthy",
        json.dumps({"type": "FeatureCollection", "features": features}, indent=2, ensure_ascii=False) + "\n",
        "GeoJSON features")
    events = [{"ts": f"2024-05-01T12:{m:02d}:00Z", "event": "page_view", "path": rng.choice(["/", "/docs", "/pricing", "/blog"])}
              for m in range(0, 40)]
    add("healthy-jsonl-events", "healthy", "\n".join(json.dumps(e) for e in events) + "\n",
        "JSON lines of events with timestamps")

    price = 150.0
    lines = ["date,open,high,low,close,volume"]
    for d in range(1, 31):
        o = price
        c = round(o * rng.uniform(0.97, 1.03), 2)
        lines.append(f"2024-04-{d:02d},{o:.2f},{max(o, c) * 1.01:.2f},{min(o, c) * 0.99:.2f},{c:.2f},{rng.randint(1, 9) * 1000000}")
        price = c
    add("healthy-csv-stock", "healthy", "\n".join(lines) + "\n", "CSV of daily prices")
    lines = ["timestamp,sensor,temperature_c,humidity"]
    for m in range(0, 60):
        lines.append(f"2024-06-01T08:{m:02d}:00,greenhouse-2,21.5,64")
    add("healthy-csv-constant-readings", "healthy", "\n".join(lines) + "\n",
        "60 CSV rows whose values are constant, only the timestamp changes: hard case")
    lines = ["employee_id,first_name,department,salary"]
    for i in range(1001, 1031):
        lines.append(f"{i},{rng.choice(FIRST_NAMES)},{rng.choice(['Sales', 'R&D', 'Support', 'Finance'])},{rng.randint(40, 140) * 1000}")
    add("healthy-csv-employees", "healthy", "\n".join(lines) + "\n", "CSV of employees")
    rows = "\n".join("  - name: worker-" + str(i) + "\n    replicas: 2\n    image: registry.local/worker:1.4.2" for i in range(1, 13))
    add("healthy-yaml-workers", "healthy", "services:\n" + rows + "\n", "YAML list of similar services")


def healthy_logs(rng):
    lines = []
    for s in range(0, 75):
        lines.append(f"2024-05-01 12:{s // 60:02d}:{s % 60:02d},123 INFO  [health] heartbeat ok (latency={rng.randint(3, 9)}ms)")
    add("healthy-log-heartbeat", "healthy", "\n".join(lines) + "\n",
        "75 heartbeat log lines: same message, timestamps and latency change")
    lines = []
    for s in range(0, 60):
        lines.append(f"[2024-05-01T09:15:{s:02d}Z] WARN retrying connection to db-primary:5432")
    add("healthy-log-identical-retries", "healthy",
        "Here is the log excerpt you asked about:\n\n```\n" + "\n".join(lines) + "\n```\n\nThe database was unreachable for a minute.\n",
        "60 identical warnings with consecutive timestamps: hard case")
    loss = 2.5
    lines = []
    for e in range(1, 51):
        loss *= rng.uniform(0.9, 0.99)
        lines.append(f"Epoch {e}/50 - loss: {loss:.4f} - accuracy: {min(0.99, 0.4 + e * 0.011):.4f} - val_loss: {loss * 1.1:.4f}")
    add("healthy-log-training", "healthy", "\n".join(lines) + "\n", "training log, one line per epoch")
    ips = [f"192.168.{rng.randint(0, 5)}.{rng.randint(2, 254)}" for _ in range(8)]
    paths = ["/", "/index.html", "/api/v1/items", "/api/v1/items/42", "/static/app.js", "/favicon.ico"]
    lines = []
    for i in range(45):
        lines.append(f'{rng.choice(ips)} - - [01/May/2024:10:{i // 2:02d}:{(i * 7) % 60:02d} +0000] "GET {rng.choice(paths)} HTTP/1.1" '
                     f'{rng.choice([200, 200, 200, 304, 404])} {rng.randint(200, 9000)}')
    add("healthy-log-access", "healthy", "\n".join(lines) + "\n", "web server access log")
    tests = ["test_parse_empty", "test_parse_single", "test_parse_nested", "test_roundtrip", "test_unicode",
             "test_large_input", "test_invalid_utf8", "test_trailing_comma", "test_comments", "test_numbers",
             "test_booleans", "test_null", "test_escape", "test_deep_nesting", "test_keys_sorted"]
    lines = [f"tests/test_parser.py::{t} PASSED{' ' * (40 - len(t))}[{(i + 1) * 100 // len(tests):>3}%]" for i, t in enumerate(tests)]
    add("healthy-log-pytest", "healthy",
        "============================= test session starts ==============================\n" + "\n".join(lines) +
        "\n\n============================== 15 passed in 0.42s ==============================\n",
        "pytest output with divider lines")


def healthy_misc(rng):
    board = "\n".join(
        "  +---+---+---+---+---+---+---+---+\n" + f"{8 - r} | " + " | ".join(row) + " |"
        for r, row in enumerate(CHESS_ROWS)) + "\n  +---+---+---+---+---+---+---+---+\n    a   b   c   d   e   f   g   h"
    add("healthy-chess-board", "healthy", "Starting position:\n\n```\n" + board + "\n```\n",
        "ASCII chess board: border lines repeat exactly")
    sudoku = "\n".join(("+-------+-------+-------+\n" if r % 3 == 0 else "") + "| . . . | . . . | . . . |" for r in range(9))
    add("healthy-empty-sudoku", "healthy", "An empty grid to copy:\n\n```\n" + sudoku + "\n+-------+-------+-------+\n```\n",
        "empty sudoku grid: exact symbolic repetition, bounded")
    zeros = "[" + ",\n ".join("[" + ", ".join(["0"] * 8) + "]" for _ in range(8)) + "]"
    add("healthy-zero-matrix", "healthy", "`np.zeros((8, 8), dtype=int).tolist()` gives:\n\n```\n" + zeros + "\n```\n",
        "8x8 zero matrix")
    adj = []
    for i in range(10):
        adj.append(" ".join("1" if (j == (i + 1) % 10 or j == (i - 1) % 10 or (i * j) % 7 == 3) and i != j else "0" for j in range(10)))
    add("healthy-adjacency-matrix", "healthy",
        "The adjacency matrix of the graph:\n\n```\n" + "\n".join(adj) + "\n```\n\nRow i lists the neighbours of vertex i.\n",
        "0/1 matrix: tiny vocabulary, bounded length")
    offset_lines = []
    data = bytes([rng.randint(0, 255) if rng.random() < 0.3 else 0 for _ in range(256)])
    for off in range(0, 256, 16):
        chunk = data[off:off + 16]
        offset_lines.append(f"{off:08x}  " + " ".join(f"{b:02x}" for b in chunk) + "  |" +
                            "".join(chr(b) if 32 <= b < 127 else "." for b in chunk) + "|")
    add("healthy-hexdump", "healthy", "```\n" + "\n".join(offset_lines) + "\n```\n", "hex dump, mostly zero bytes")
    add("healthy-dividers", "healthy",
        "=" * 80 + "\nQUARTERLY REPORT\n" + "=" * 80 + "\n\nRevenue grew 12% over the quarter.\n\n" + "-" * 80 +
        "\nCosts\n" + "-" * 80 + "\n\nCosts were flat.\n" + "=" * 80 + "\n",
        "80-character divider lines")
    tree = "\n".join(TREE_LINES)
    add("healthy-directory-tree", "healthy", "```\n" + tree + "\n```\n", "directory tree with repeated box drawing")


def healthy_repetition_on_request(rng):
    add("healthy-say-hello-5", "healthy", "hello hello hello hello hello\n", "the user asked: say hello 5 times")
    add("healthy-say-hello-10-sentence", "healthy",
        "Sure! Here you go:\n\nHello! Hello! Hello! Hello! Hello! Hello! Hello! Hello! Hello! Hello!\n\nThat's ten hellos.\n",
        "asked for ten hellos")
    add("healthy-i-love-you-12", "healthy",
        "\n".join(["I love you."] * 12) + "\n\n(12 times, as requested.)\n", "asked for twelve lines")
    add("healthy-lines-punishment", "healthy",
        "\n".join(["I will not talk in class."] * 10) + "\n", "ten lines written on a blackboard")
    add("healthy-laughter", "healthy", "Hahahahahahahahahahaha, that's a good one! 😂😂😂\n", "laughter")
    add("healthy-banana-spelling", "healthy", "B-A-N-A-N-A. Banana has three A's and two N's.\n", "spelling")
    add("healthy-echo-pairs", "healthy",
        "\n".join(f"{w} {w}" for w in ["test", "check", "mic", "one", "two", "sound", "level", "ready"]) + "\n",
        "each word twice")
    add("healthy-cheer", "healthy",
        "Go team go! Go team go! Go team go!\nWe will win, we will win, we will win today!\n", "chant with three repeats")


def healthy_cumulative_songs(rng):
    """Traditional songs whose verses repeat earlier lines: the hardest legitimate repetition."""
    gifts = ["a partridge in a pear tree", "two turtle doves", "three French hens", "four calling birds",
             "five golden rings", "six geese a-laying", "seven swans a-swimming", "eight maids a-milking",
             "nine ladies dancing", "ten lords a-leaping", "eleven pipers piping", "twelve drummers drumming"]
    ordinals = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth",
                "eleventh", "twelfth"]
    verses = []
    for day in range(12):
        lines = [f"On the {ordinals[day]} day of Christmas my true love gave to me"]
        for k in range(day, -1, -1):
            gift = gifts[k]
            lines.append(("and " if k == 0 and day > 0 else "") + gift + ("." if k == 0 else ","))
        verses.append("\n".join(lines))
    add("healthy-song-twelve-days", "healthy", "\n\n".join(verses) + "\n",
        "The Twelve Days of Christmas: each verse repeats all earlier gifts (cumulative song)")

    animals = [("cow", "moo"), ("pig", "oink"), ("duck", "quack"), ("sheep", "baa"), ("horse", "neigh")]
    verses = []
    for animal, sound in animals:
        verses.append(
            f"Old MacDonald had a farm, E-I-E-I-O,\nand on that farm he had a {animal}, E-I-E-I-O,\n"
            f"with a {sound} {sound} here and a {sound} {sound} there,\nhere a {sound}, there a {sound}, "
            f"everywhere a {sound} {sound},\nOld MacDonald had a farm, E-I-E-I-O.")
    add("healthy-song-old-macdonald", "healthy", "\n\n".join(verses) + "\n",
        "Old MacDonald: E-I-E-I-O and the animal sound repeat in every verse")

    verses = []
    for n in range(99, 79, -1):
        verses.append(f"{n} bottles of beer on the wall, {n} bottles of beer.\n"
                      f"Take one down and pass it around, {n - 1} bottles of beer on the wall.")
    add("healthy-song-99-bottles", "healthy", "\n\n".join(verses) + "\n\n...and so on down to zero.\n",
        "99 Bottles of Beer, twenty verses: the same two lines with a counter")

    parts = [("the house", "that Jack built"), ("the malt", "that lay in"), ("the rat", "that ate"),
             ("the cat", "that killed"), ("the dog", "that worried"), ("the cow with the crumpled horn", "that tossed"),
             ("the maiden all forlorn", "that milked"), ("the man all tattered and torn", "that kissed")]
    verses = []
    for k in range(len(parts)):
        lines = [f"This is {parts[k][0]}"]
        for j in range(k, 0, -1):
            lines.append(f"{parts[j][1]} {parts[j - 1][0]}")
        lines[-1] += " that Jack built." if k > 0 else ""
        if k == 0:
            lines[0] += " that Jack built."
        verses.append("\n".join(lines))
    add("healthy-song-house-jack-built", "healthy", "\n\n".join(verses) + "\n",
        "This Is the House That Jack Built: cumulative rhyme")

    parts = [("wheels", "go round and round"), ("wipers", "go swish swish swish"), ("horn", "goes beep beep beep"),
             ("doors", "go open and shut"), ("babies", "go wah wah wah"), ("mummies", "go shh shh shh")]
    verses = []
    for thing, action in parts:
        verb, rest = action.split(" ", 1)
        verses.append(f"The {thing} on the bus {action}, {rest}, {rest},\nthe {thing} on the bus {action},\nall through the town.")
    add("healthy-song-wheels-on-the-bus", "healthy", "\n\n".join(verses) + "\n",
        "The Wheels on the Bus: each line says its action three times")


def healthy_hard_structured(rng):
    add("healthy-counting-sheep", "healthy",
        "Counting sheep: " + ", ".join(f"{i} sheep" for i in range(1, 121)) + ". Good night!\n",
        "counting with a repeated word: 1 sheep, 2 sheep, ...")
    calls = ["openConfig(path)", "parseConfig(raw)", "connectDB(cfg.DSN)", "migrate(db)", "loadUsers(db)",
             "startCache(cfg.Cache)", "startServer(cfg.Addr)", "registerMetrics()"]
    body = []
    for i, call in enumerate(calls):
        var = ["f", "cfg", "db", "_", "users", "cache", "srv", "_"][i]
        body.append(f"\t{var}, err := {call}\n\tif err != nil {{\n\t\treturn fmt.Errorf(\"{call.split('(')[0]}: %w\", err)\n\t}}")
    add("healthy-code-go-errors", "healthy", "```go\nfunc run(path string) error {\n" + "\n".join(body) +
        "\n\treturn nil\n}\n```\n", "Go: eight `if err != nil` blocks in a row")
    boards = []
    cells = [" "] * 9
    moves = [4, 0, 8, 2, 1, 7, 6, 3, 5]
    for turn, m in enumerate(moves):
        cells[m] = "X" if turn % 2 == 0 else "O"
        rows = [" " + " | ".join(cells[r * 3:r * 3 + 3]) for r in range(3)]
        boards.append(f"Move {turn + 1}: {cells[m]} plays square {m + 1}\n\n" + "\n---+---+---\n".join(rows))
    add("healthy-tic-tac-toe", "healthy", "\n\n".join(boards) + "\n\nIt's a draw!\n",
        "tic-tac-toe transcript: the same board printed nine times with one change each")
    bars = "\n".join(f"[{'#' * i}{' ' * (20 - i)}] {i * 5:>3}%" for i in range(0, 21))
    add("healthy-progress-bars", "healthy", "```\n" + bars + "\n```\n", "ASCII progress bar growing line by line")
    drills = "\n".join(f"{syl}: {syl}1 {syl}2 {syl}3 {syl}4 - " + " ".join(
        rng.sample(["mā", "má", "mǎ", "mà", "bā", "bá", "bǎ", "bà", "shī", "shí", "shǐ", "shì"], 4))
        for syl in ["ma", "ba", "shi", "ma", "ba", "shi", "ma", "ba"])
    add("healthy-pinyin-drill", "healthy", "Tone practice:\n\n" + drills + "\n", "pronunciation drill")
    lines = ["| Metric | Q1 | Q2 | Q3 | Q4 |", "|---|---|---|---|---|"]
    for metric in ["Revenue", "Churn", "NPS", "CAC", "LTV", "ARPU", "MRR", "Burn", "Runway", "Headcount",
                   "Tickets", "Uptime", "Latency", "Errors", "Deploys", "Incidents", "Leads", "Trials"]:
        lines.append(f"| {metric} | N/A | N/A | N/A | N/A |")
    add("healthy-table-all-na", "healthy", "Template (fill in the numbers):\n\n" + "\n".join(lines) + "\n",
        "18-row table whose cells are all N/A")
    meals = ["Pasta", "Leftovers", "Stir-fry", "Leftovers", "Tacos", "Pizza", "Roast", "Leftovers", "Soup"]
    lines = ["| Week | Mon | Tue | Wed | Thu | Fri | Sat | Sun |", "|---|---|---|---|---|---|---|---|"]
    for w in range(1, 7):
        lines.append(f"| {w} | " + " | ".join(rng.choice(meals) for _ in range(7)) + " |")
    add("healthy-table-meal-plan", "healthy", "\n".join(lines) + "\n", "meal plan where 'Leftovers' recurs")
    times = " ".join(f"{h:02d}:{m:02d}" for h in range(6, 22) for m in (0, 15, 30, 45))
    add("healthy-bus-timetable", "healthy", "Route 12 departures from Central Station:\n\n" + times + "\n",
        "timetable: 64 times every 15 minutes")
    cron = "\n".join(f"{m} {h} * * * /usr/local/bin/backup.sh --target vol{i}"
                     for i, (m, h) in enumerate([(0, 1), (15, 1), (30, 1), (45, 1), (0, 2), (15, 2), (30, 2), (45, 2),
                                                 (0, 3), (15, 3), (30, 3), (45, 3)]))
    add("healthy-crontab", "healthy", "```\n" + cron + "\n```\n", "crontab with twelve similar lines")
    listing = "\n".join(f"-rw-r--r--  1 ana  staff  {rng.randint(100, 99999):>6} May {rng.randint(1, 28):>2} 10:{rng.randint(0, 59):02d} "
                        f"report_{i:03d}.csv" for i in range(1, 41))
    add("healthy-ls-listing", "healthy", "$ ls -l reports/\n" + listing + "\n", "ls -l of forty similar files")
    steps = []
    n, d = 987654, 7
    rem = 0
    for digit in str(n):
        cur = rem * 10 + int(digit)
        q = cur // d
        steps.append(f"Bring down {digit}: {cur} / {d} = {q} remainder {cur - q * d}.")
        rem = cur - q * d
    add("healthy-long-division", "healthy",
        f"Long division of {n} by {d}:\n\n" + "\n".join(steps) + f"\n\nSo {n} / {d} = {n // d} remainder {n % d}.\n",
        "long division steps of the same shape")
    turns = []
    for q, a in [("What's the weather like?", "I can't check live weather, but you can try a weather app."),
                 ("OK. Tell me a joke.", "Why did the scarecrow win an award? He was outstanding in his field."),
                 ("Another one.", "I told my computer I needed a break, and it said: no problem, I'll go to sleep."),
                 ("One more.", "Parallel lines have so much in common. It's a shame they'll never meet."),
                 ("Thanks!", "You're welcome! Anything else?")]:
        turns.append(f"User: {q}\nAssistant: {a}")
    add("healthy-chat-transcript", "healthy", "\n\n".join(turns) + "\n", "chat transcript with repeated speaker labels")
    add("healthy-celebration", "healthy",
        "🎉🎉🎉 Congratulations on the new job! 🎉🎉🎉\n\nYou worked so hard for this. 🥳🥳 Cheers! 🥂🥂🥂\n",
        "emoji repeated a few times")


# ---------------------------------------------------------------- degenerate


def degenerate_founding_failure(rng):
    arithmetic = "We are tasked with a simple arithmetic problem: " + "2 + 2 = 2." * 1000
    add("degenerate-servingmd-arithmetic", "degenerate", cut(arithmetic, 4000),
        "the founding failure (docs/serving.md), verbatim, extended to a max_tokens cut", "periodic_loop")
    add("degenerate-servingmd-arithmetic-short", "degenerate", cut(arithmetic, 1200),
        "the founding failure (docs/serving.md), cut early", "periodic_loop")
    primes = ("prime " * 2000).strip()
    add("degenerate-servingmd-prime", "degenerate", cut(primes, 3000),
        "the founding failure (docs/serving.md): prime prime prime ...", "periodic_loop")
    add("degenerate-servingmd-prime-after-intro", "degenerate",
        cut("The prime numbers less than 20 are prime prime " + primes, 2400),
        "the prime loop after a normal start", "periodic_loop")


def degenerate_token_loops(rng):
    words = ["the", "and", "I", "is", "yes", "Answer:", "**", "0", "的", "😂", "!", "...", "\n", "—", "Step",
             "ok", "<|im_end|>", "Wait,"]
    for i, w in enumerate(words):
        sep = "" if w in ("!", "\n", "—", "的", "😂", "...") else " "
        opening = rng.choice(OPENINGS) if i % 2 == 0 else ""
        length = rng.randint(900, 2000)
        add(f"degenerate-token-loop-{i:02d}", "degenerate", cut(opening + (w + sep) * 3000, length),
            f"one token repeated: {w!r}" + (" after a normal opening" if opening else ""), "periodic_loop")


def degenerate_phrase_loops(rng):
    for i, phrase in enumerate(LOOP_PHRASES):
        opening = rng.choice(OPENINGS) if i % 3 != 0 else ""
        length = rng.randint(1200, 2500)
        add(f"degenerate-phrase-loop-{i:02d}", "degenerate", cut(opening + phrase * 1000, length),
            "short phrase loop" + (" after a normal opening" if opening else ""), "periodic_loop")


def degenerate_sentence_loops(rng):
    for i, sentence in enumerate(LOOP_SENTENCES):
        opening = rng.choice(OPENINGS) + "\n\n" if i % 2 == 0 else rng.choice(OPENINGS)
        length = rng.randint(1500, 3000)
        add(f"degenerate-sentence-loop-{i:02d}", "degenerate", cut(opening + (sentence + " ") * 200, length),
            "sentence loop after a normal opening", "periodic_loop")


def degenerate_paragraph_loops(rng):
    for name, (note, paragraph) in read_sections("loop_paragraphs.txt").items():
        opening = rng.choice(OPENINGS) + "\n\n"
        repeats = rng.randint(4, 7)
        text = opening + (paragraph + "\n\n") * repeats
        add(f"degenerate-paragraph-loop-{name}", "degenerate", text.rstrip("\n") + "\n",
            f"{note}: {len(paragraph)} chars repeated {repeats} times", "periodic_loop")


def degenerate_code_loops(rng):
    for i, (note, opening, unit, count) in enumerate(CODE_LOOPS):
        add(f"degenerate-code-loop-{i:02d}", "degenerate", opening + unit * count, note, "periodic_loop")


def degenerate_babble(rng):
    for i, vocab in enumerate(BABBLE_VOCABS):
        n = rng.randint(250, 600)
        words = [rng.choice(vocab) for _ in range(n)]
        opening = rng.choice(OPENINGS) if i % 2 == 0 else ""
        joiner = "" if all(len(w) == 1 and ord(w) > 0x2E80 for w in vocab) else " "
        add(f"degenerate-babble-{i:02d}", "degenerate", opening + joiner.join(words),
            "random babble over a few words", "ngram_collapse")
    for i, (template, slots) in enumerate(VARIED_LOOPS):
        opening = rng.choice(OPENINGS) + " "
        parts = []
        for _ in range(rng.randint(40, 90)):
            parts.append(template.format(*[rng.choice(options) for options in slots]))
        add(f"degenerate-varied-loop-{i:02d}", "degenerate", opening + " ".join(parts),
            "a sentence loop with small random variations", "ngram_collapse")
    # The arithmetic loop with sampling noise: not exactly periodic any more.
    for i in range(4):
        parts = []
        for _ in range(rng.randint(350, 500)):
            parts.append(rng.choice(["2 + 2 = 2.", "2 + 2 = 2.", "2 + 2 = 2.", "2 + 2 = 4.", "2 + 2 = ", "2 + 2 = 22."]))
        add(f"degenerate-noisy-arithmetic-{i}", "degenerate",
            "We are tasked with a simple arithmetic problem: " + "".join(parts),
            "the founding failure's arithmetic loop with sampling noise", "ngram_collapse")


def degenerate_reasoning(rng):
    for i in range(12):
        body = rambling_reasoning(rng, i)
        add(f"degenerate-unclosed-reasoning-{i:02d}", "degenerate", "<think>\n" + body,
            f"reasoning that never reaches </think> ({len(body)} chars)", "unclosed_reasoning")


# ---------------------------------------------------------------- short texts (issue 17)
# Replies of a few hundred bytes, the size a max_tokens cut leaves. The degenerate ones end inside
# their loop; the healthy ones repeat legitimately and many of them end in their repetition too.


def healthy_short_repetition():
    add("healthy-short-hello-10-bare", "healthy", "hello " * 9 + "hello",
        "asked for ten hellos; the text ends in them, with no newline")
    add("healthy-short-lines-10-bare", "healthy", "\n".join(["I will not talk in class."] * 10),
        "ten requested lines, no final newline: ends inside the repetition, at a whole line")
    sentence = "The quick brown fox jumps over the lazy dog."
    add("healthy-short-sentence-10-complete", "healthy", " ".join([sentence] * 10),
        "a sentence asked for ten times (450 bytes) that ends with its full stop")
    add("healthy-short-hello-world-20-closed", "healthy",
        "Here you go:\n\n" + "Hello, World!\n" * 20 + "\nThat's 20 times.\n",
        "twenty requested lines followed by a closing sentence")
    add("healthy-short-thank-you-10", "healthy", "Thank you! " * 9 + "Thank you!",
        "ten thank-yous, ending in them")
    add("healthy-short-ha-ha", "healthy", "ha ha ha ha ha ha ha ha", "laughter in moderation, ends in it")
    add("healthy-short-hahaha", "healthy", "That's a good one! Hahahahahahahahahahahahahaha",
        "laughter written as one word at the end of the reply")
    add("healthy-short-chinese-laughter", "healthy", "这个笑话太好笑了！哈哈哈哈哈哈哈哈",
        "Chinese laughter at the end of the reply")
    add("healthy-short-chant", "healthy", "Let's go, team! Let's go, team! Let's go, team!",
        "a chant repeated three times")
    add("healthy-short-divider-end", "healthy", "Summary of the run\n" + "=" * 80,
        "an 80-character divider that ends the reply without a newline")
    add("healthy-short-wide-divider-end", "healthy", "Report\n" + "-" * 160,
        "a 160-character divider at the very end")
    add("healthy-short-table-rule-end", "healthy",
        "| Name | Date | Amount | Notes | Owner | Status |\n|---|---|---|---|---|---|",
        "an empty markdown table: the header and its rule, which ends the reply")
    cols = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun", "Total", "Avg", "Min", "Max", "Note"]
    rows = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols),
            "| " + " | ".join(str(v) for v in (3, 5, 2, 0, 4, 1, 6, 21, 3, 0, 6, "ok")) + " |",
            "| " + " | ".join(str(v) for v in (1, 1, 1, 1, 1, 1, 1, 7, 1, 1, 1, "flat")) + " |"]
    add("healthy-short-wide-table", "healthy", "\n".join(rows), "twelve-column table, a row of equal cells last")
    add("healthy-short-count-1-40", "healthy", ", ".join(str(i) for i in range(1, 41)),
        "counting to 40, ending on the last number")
    add("healthy-short-counting-sheep-cut", "healthy",
        ", ".join(f"{i} sheep" for i in range(1, 26)) + ", 26 sh",
        "counting sheep cut mid-word: the numbers change, so it is not a loop")
    add("healthy-short-one-seventh", "healthy", "1/7 written to 120 decimal places:\n\n0." + "142857" * 20,
        "a repeating decimal: exactly periodic digits to the end")
    add("healthy-short-one-third", "healthy", "1/3 = 0." + "3" * 60, "sixty threes of a repeating decimal")
    add("healthy-short-alternating-bits", "healthy",
        "Here is the alternating pattern of 64 bits you asked for:\n\n" + "01" * 32,
        "0101... asked for, at the end of the reply")
    add("healthy-short-morse-sos", "healthy", "SOS in Morse code, three times: " + " ".join(["... --- ..."] * 3),
        "Morse code repeated three times")
    add("healthy-short-placeholder-list", "healthy", "Agenda for Friday:\n" + "\n".join(["- TBD"] * 6),
        "a list of placeholders, ending in them")
    add("healthy-short-ascii-box", "healthy",
        "+----------+\n" + "|          |\n" * 4 + "+----------+", "an empty ASCII box")
    add("healthy-short-code-repeated-lines", "healthy",
        "```python\nimport time\n\nfor step in range(3):\n    print(step)\n    time.sleep(1)\n"
        "print(\"-\" * 40)\nprint(\"-\" * 40)\nprint(\"-\" * 40)\n```",
        "code with three identical lines before the closing fence")
    add("healthy-short-lisp-parens", "healthy",
        "(defun fib (n)\n  (if (< n 2)\n      n\n      (+ (fib (- n 1)) (fib (- n 2)))))",
        "Lisp ending in a run of closing parentheses")
    refrain = "and the river runs on, and the river runs on."
    add("healthy-short-poem-refrain-end", "healthy",
        "The mill is quiet now, the wheel is still,\n" + refrain + "\n\n"
        "The children left for cities over the hill,\n" + refrain + "\n\n"
        "The bridge is mended where the stones once fell,\n" + refrain,
        "a short poem whose refrain ends every stanza and the poem")
    add("healthy-short-knock-knock", "healthy",
        "Knock, knock.\nWho's there?\nBanana.\nBanana who?\n\n" * 3 +
        "Knock, knock.\nWho's there?\nOrange.\nOrange who?\nOrange you glad I didn't say banana?",
        "the banana knock-knock joke: three identical exchanges, then the punchline")
    add("healthy-short-mississippi", "healthy", "M-I-S-S-I-S-S-I-P-P-I. Mississippi has four S's, four I's and two P's.",
        "spelling with repeated letters")
    add("healthy-short-cut-prose", "healthy",
        "The lighthouse on the northern cape was built in 1873, after three ships were lost on the same reef in "
        "a single winter. For most of its working life it was kept by one family, who passed the job from fa",
        "normal prose cut mid-word by max_tokens: the cut alone is not a loop")
    add("healthy-short-cut-list", "healthy",
        "Capitals:\n1. Paris\n2. Berlin\n3. Rome\n4. Madrid\n5. Lisbon\n6. Warsaw\n7. Sto",
        "a numbered list cut mid-word")


def degenerate_short_loops():
    def short(name, text, note):
        add(f"degenerate-short-{name}", "degenerate", text, note + f" ({len(text.encode())} bytes)", "periodic_loop")

    short("actually", "Okay. " + "Actually, " * 24, "issue 17: 'Actually, ' 24 times after 'Okay.', cut by max_tokens")
    short("equals-line", "=" * 230, "issue 17: a line of 230 '=' cut by max_tokens")
    s = "The meeting has been moved to Thursday at 3 pm. "
    short("sentence-cut-mid-word", "Sure, here is the update.\n\n" + s * 9 + s[:34],
          "issue 17: a sentence repeated ten times, the tenth cut mid-word")
    short("value-token", cut("value token token " * 40, 250), "issue 17: 'value token token' cut mid-word")
    short("of-the", "of the " * 26, "'of the ' 26 times")
    short("yes", "yes " * 45, "'yes ' 45 times: fewer bytes than the streaming rule needs")
    short("wait", "Hmm. " + "Wait, " * 30, "'Wait, ' 30 times")
    short("answer-sentence", "The answer is 4. " * 14, "a short sentence 14 times, ending after a whole repeat")
    short("i-think-cut", cut("I think " * 40, 165), "'I think ' cut mid-word")
    s = "I'm sorry, I cannot help with that. "
    short("sorry-cut", s * 4 + s[:16], "an apology four times, the fifth cut mid-word")
    s = "这个问题的答案是四。"
    short("chinese-cut", s * 5 + s[:3], "a Chinese sentence five times, the sixth cut mid-sentence")
    s = '{"id": 1, "name": "Alice"}, '
    short("json-cut", "[" + s * 8 + s[:21], "the same JSON object eight times, the ninth cut mid-word")
    short("code-return-cut", "def f(x):\n" + "    return x\n" * 10 + "    ret",
          "the same return line ten times, the eleventh cut mid-word")
    short("table-row-cut", "| id | name | age |\n|---|---|---|\n" + "| 1 | Alice | 30 |\n" * 8 + "| 1 | Al",
          "the same table row eight times, the ninth cut mid-word")
    s = "Hmm, let me think about this. "
    short("thinking-cut", "<think>\n" + s * 8 + s[:14], "reasoning that repeats one sentence, cut mid-word")
    s = "Step 1: add the numbers.\n"
    short("step-cut", s * 6 + s[:14], "the same step line six times, the seventh cut mid-word")
    short("newlines", "Here is the answer:" + "\n" * 200, "200 newlines to the end of the reply")
    short("zeros", "data = [" + "0, " * 70, "a zero array that the length limit cut")
    short("emoji", "Haha, good one! " + "😂" * 45, "45 emoji to the end of the reply")
    short("table-rule", "| a | b |\n" + "|---" * 60, "a table rule that never ends")
    short("dots", "The answer is" + "." * 220, "220 dots to the end of the reply")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed corpus instead of writing it")
    args = parser.parse_args()
    rng = random.Random(20240521)
    healthy_hand_written()
    healthy_tables(rng)
    healthy_lists(rng)
    healthy_code(rng)
    healthy_counting(rng)
    healthy_data(rng)
    healthy_logs(rng)
    healthy_misc(rng)
    healthy_repetition_on_request(rng)
    healthy_cumulative_songs(rng)
    healthy_hard_structured(rng)
    degenerate_founding_failure(rng)
    degenerate_token_loops(rng)
    degenerate_phrase_loops(rng)
    degenerate_sentence_loops(rng)
    degenerate_paragraph_loops(rng)
    degenerate_code_loops(rng)
    degenerate_babble(rng)
    degenerate_reasoning(rng)
    healthy_short_repetition()
    degenerate_short_loops()

    ids = [item["id"] for item in ITEMS]
    assert len(ids) == len(set(ids)), "duplicate ids"
    text = "".join(json.dumps(item, ensure_ascii=False) + "\n" for item in ITEMS)
    healthy = sum(item["label"] == "healthy" for item in ITEMS)
    summary = f"{len(ITEMS)} items: {healthy} healthy, {len(ITEMS) - healthy} degenerate, {len(text.encode())} bytes"
    if args.check:
        if OUT.read_text(encoding="utf-8") != text:
            sys.exit(f"{OUT} differs from what the script generates; rerun it without --check")
        print("corpus up to date:", summary)
        return
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}: {summary}")


if __name__ == "__main__":
    main()
