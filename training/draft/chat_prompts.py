"""Chat-style prompts for distilling a draft from an instruct target: the target's own answers to these are the
draft's training text (sequence-level distillation). Prompts are instruction forms × topics; the held-out topics
(used for evaluation and the benchmark's chat prompts) never appear in training prompts."""
from __future__ import annotations

import random
import re

FORMS = (
    "What is {t}?",
    "Explain {t} in simple terms.",
    "Give me three facts about {t}.",
    "List five things to know about {t}.",
    "Write a short paragraph about {t}.",
    "Why does {t} matter?",
    "Explain {t} to a ten-year-old.",
    "Summarize the history of {t} in a few sentences.",
    "What are the pros and cons of {t}?",
    "Write a haiku about {t}.",
    "Give a one-sentence definition of {t}.",
    "What are common misconceptions about {t}?",
    "How would you teach {t} to a beginner?",
    "Write a short story that involves {t}.",
    "Translate into French: \"I would like to learn more about {t}.\"",
    "Write a tweet about {t}.",
)

# More varied forms (the first draft's held-out agreement plateaued on FORMS alone): other registers, lengths and tasks.
MORE_FORMS = (
    "Can you tell me about {t}?",
    "I am curious about {t}. Where should I start?",
    "Describe {t} in two sentences.",
    "How does {t} work?",
    "Write a limerick about {t}.",
    "Compare {t} with something from everyday life.",
    "What would happen if there were no {t}?",
    "Give me a quiz of three questions about {t}, with answers.",
    "Write an email to a friend recommending that they learn about {t}.",
    "What is the most surprising fact about {t}?",
    "Explain {t} step by step.",
    "Write a dialogue between a student and a teacher about {t}.",
    "Summarize {t} as a bulleted list.",
    "What questions do scientists still ask about {t}?",
    "Write a product description inspired by {t}.",
    "Tell me a joke about {t}.",
    "Explain {t} using an analogy.",
    "Write the opening paragraph of an essay on {t}.",
    "What careers are related to {t}?",
    "Give me a fun fact about {t} and explain why it is true.",
)

# The wider data's forms: more registers and tasks again, asked of TOPICS + NEW_TOPICS (chat_sources.py).
NEW_FORMS = (
    "In what ways is {t} useful in daily life?",
    "Write a short poem about {t}.",
    "What is the difference between {t} and a related idea?",
    "Give me five tips related to {t}.",
    "Write a news headline and a short article about {t}.",
    "What are three questions a child might ask about {t}, and their answers?",
    "Explain {t} as if I were an expert.",
    "Write a motivational message that mentions {t}.",
    "What mistakes do beginners make with {t}?",
    "Write a recipe-style guide to understanding {t}.",
    "Give me a short timeline of {t}.",
    "Argue for and against the importance of {t}.",
    "Describe {t} to someone who has never heard of it.",
    "What would a museum exhibit about {t} show?",
)

NEW_TOPICS = (
    "city parks", "bridges", "castles", "skyscrapers", "lighthouses", "canals", "ancient Rome's roads",
    "the Aztecs", "the Incas", "the Mongol Empire", "the samurai", "the pharaohs", "the Cold War", "the space race",
    "the telephone", "the radio", "television", "the camera", "the steam engine", "the light bulb", "the wheel",
    "paper", "glass", "steel", "concrete", "cotton", "silk", "rubber", "salt", "sugar", "rice", "potatoes", "cheese",
    "spices", "olive oil", "honey", "apples", "bananas", "frogs", "sharks", "whales", "owls", "eagles", "butterflies",
    "ants", "spiders", "wolves", "horses", "tigers", "kangaroos", "koalas", "bats", "snakes", "turtles", "forests",
    "wetlands", "caves", "islands", "lakes", "waterfalls", "clouds", "fog", "seasons", "tides", "the wind",
    "earth's core", "plate tectonics", "the ozone layer", "galaxies", "stars", "the sun", "Jupiter", "Saturn's rings",
    "gravity waves", "quantum physics", "relativity", "energy", "friction", "heat", "temperature", "pressure",
    "fractions", "percentages", "logarithms", "graphs", "infinity", "zero", "the number pi", "puzzles", "board games",
    "music theory", "drums", "the guitar", "opera", "ballet", "theater", "sculpture", "architecture", "fashion",
    "languages of the world", "writing systems", "libraries", "museums", "newspapers", "advertising", "banks",
    "taxes", "trade", "small businesses", "marketing", "negotiation", "habits", "motivation", "creativity",
    "curiosity", "patience", "stress", "laughter", "dreams", "first aid", "hygiene", "nutrition labels",
    "public transport", "urban planning", "volunteering", "elections", "human rights", "the United Nations",
    "web browsers", "search engines", "email", "spreadsheets", "compilers", "computer networks", "cybersecurity",
    "data privacy", "APIs", "regular expressions", "hash tables", "linked lists", "binary trees", "graph algorithms",
    "dynamic programming", "big-O notation", "functional programming", "object-oriented programming", "debugging",
    "code review", "the command line", "Linux", "JavaScript", "SQL", "HTML", "the Rust language",
)

CODE_FORMS = (
    "Write a Python function that {t}.",
    "Write a Python function that {t}, with a docstring.",
    "Explain how to write code that {t}.",
    "Write a JavaScript function that {t}.",
)

TOPICS = (
    "photosynthesis", "the water cycle", "gravity", "black holes", "the French Revolution", "the Roman Empire",
    "volcanoes", "earthquakes", "climate change", "renewable energy", "solar panels", "electric cars", "the internet",
    "machine learning", "neural networks", "the human heart", "the immune system", "vaccines", "DNA", "evolution",
    "the moon", "Mars", "the solar system", "the stock market", "inflation", "supply and demand", "democracy",
    "the printing press", "the Industrial Revolution", "coffee", "tea", "chocolate", "bread baking", "sleep",
    "exercise", "meditation", "the ocean", "coral reefs", "rainforests", "deserts", "honeybees", "dolphins", "elephants",
    "cats", "dogs", "birds migration", "the Great Wall of China", "the pyramids of Egypt", "Shakespeare", "jazz music",
    "the piano", "painting", "photography", "the Olympic Games", "soccer", "chess", "mathematics", "prime numbers",
    "the Pythagorean theorem", "probability", "statistics", "algebra", "geometry", "calculus", "computers",
    "operating systems", "databases", "encryption", "passwords", "recycling", "plastic pollution", "air pollution",
    "friendship", "time management", "public speaking", "learning a language", "reading books", "writing essays",
    "job interviews", "saving money", "budgeting", "healthy eating", "vitamins", "water", "electricity", "magnets",
    "light", "sound", "rainbows", "snow", "hurricanes", "tornadoes", "glaciers", "rivers", "mountains", "maps",
    "the compass", "airplanes", "trains", "bicycles", "rockets", "satellites", "telescopes", "microscopes", "atoms",
    "molecules", "chemical reactions", "the periodic table", "batteries", "the brain", "memory", "emotions",
    "happiness", "kindness", "teamwork", "leadership", "cities", "farming", "gardening", "trees", "flowers",
    "mushrooms", "the Renaissance", "ancient Greece", "the Vikings", "the Silk Road", "the Moon landing",
    "the Titanic", "dinosaurs", "fossils", "the Amazon river", "Antarctica", "Japan", "Italy", "Brazil", "India",
    "Canada", "Australia", "the English language", "poetry", "novels", "movies", "video games", "social media",
    "smartphones", "robots", "artificial intelligence", "self-driving cars", "cloud computing", "open source software",
    "version control", "unit testing", "the Python language", "recursion", "sorting algorithms",
)

CODE_TOPICS = (
    "reverses a string", "checks whether a number is prime", "computes the factorial of n",
    "returns the n-th Fibonacci number", "counts the vowels in a string", "finds the largest item in a list",
    "removes duplicates from a list", "checks whether a word is a palindrome", "sums the digits of a number",
    "converts Celsius to Fahrenheit", "merges two sorted lists", "flattens a nested list", "counts word frequencies",
    "computes the average of a list", "sorts a list of dictionaries by a key", "reads a file and counts its lines",
    "returns the greatest common divisor of two numbers", "checks whether two strings are anagrams",
    "generates the first n square numbers", "capitalizes every word in a sentence", "finds the second largest number",
    "implements binary search", "implements bubble sort", "validates an email address with a regular expression",
    "converts a decimal number to binary", "transposes a matrix", "returns the median of a list",
    "checks whether a year is a leap year", "splits a list into chunks of size k", "computes the power set of a list",
)

HELD_OUT_TOPICS = (
    "the Eiffel Tower", "penguins", "lightning", "the Sahara", "Mount Everest", "octopuses", "the Nile",
    "wind turbines", "the violin", "origami", "tsunamis", "the human skeleton", "bees and pollination", "the Arctic",
    "comets", "the metric system",
)

HELD_OUT_CODE = (
    "returns the sum of the even numbers in a list", "counts the uppercase letters in a string",
    "checks whether a list is sorted", "returns the minimum and maximum of a list",
)

# Code beyond "write a function that …" (the wider data): more tasks, functions from a docstring, a bug to fix, code to
# explain. None of them touches HELD_OUT_CODE (the held-out guard below checks every prompt built from them).
NEW_CODE_TOPICS = (
    "counts how many times each character occurs in a string", "rotates a list by k positions",
    "checks whether a string contains balanced parentheses", "returns the intersection of two lists",
    "converts a Roman numeral to an integer", "finds the longest word in a sentence", "computes a running total",
    "groups words by their first letter", "returns the n largest items of a list", "interleaves two lists",
    "removes the whitespace from both ends of every string in a list", "converts a string to title case",
    "computes the dot product of two vectors", "checks whether a number is a perfect square",
    "returns the indices of a value in a list", "counts the lines, words and characters of a text",
)

CODE_REQUESTS = (
    "Write a Python function that {t}, and show an example call.",
    "Write a Python function that {t}. Add type hints.",
    "How would you test a function that {t}?",
)

DOCSTRING_TASKS = (  # (signature, docstring): "implement this function"
    ("def word_count(text: str) -> int:", "Return the number of words in text."),
    ("def clamp(x: float, low: float, high: float) -> float:", "Return x limited to the range [low, high]."),
    ("def is_even(n: int) -> bool:", "Return True when n is divisible by two."),
    ("def last_n(items: list, n: int) -> list:", "Return the last n items of the list."),
    ("def initials(name: str) -> str:", "Return the capitalised first letters of each part of a name."),
    ("def average_length(words: list[str]) -> float:", "Return the mean length of the words, 0.0 for no words."),
    ("def celsius_table(start: int, stop: int) -> dict:", "Map each Celsius degree in [start, stop) to Fahrenheit."),
    ("def unique_sorted(items: list) -> list:", "Return the distinct items in ascending order."),
    ("def count_digits(n: int) -> int:", "Return how many decimal digits the integer n has."),
    ("def repeat_words(text: str, k: int) -> str:", "Repeat every word of text k times, separated by spaces."),
    ("def safe_divide(a: float, b: float) -> float | None:", "Return a / b, or None when b is zero."),
    ("def parse_pairs(text: str) -> dict:", "Parse 'key=value' pairs separated by commas into a dictionary."),
    ("def hamming(a: str, b: str) -> int:", "Return the number of positions where two equal-length strings differ."),
    ("def chunk_string(s: str, size: int) -> list[str]:", "Split s into pieces of at most size characters."),
    ("def nth_prime(n: int) -> int:", "Return the n-th prime number, counting 2 as the first."),
    ("def dedent_lines(lines: list[str]) -> list[str]:", "Strip the common leading spaces from every line."),
)

DOCSTRING_FORMS = (
    "Implement this Python function:\n\n{code}",
    "Complete the body of this function and explain your approach:\n\n{code}",
)

BUGGY_CODE = (  # small functions with one bug each (the prompt says only that something is wrong)
    "def factorial(n):\n    result = 0\n    for i in range(1, n + 1):\n        result *= i\n    return result",
    "def reverse(s):\n    return s[::1]",
    "def mean(xs):\n    return sum(xs) / len(xs) - 1",
    "def contains(items, x):\n    for item in items:\n        if item == x:\n            return False\n    return True",
    "def count_vowels(s):\n    return sum(1 for c in s if c in 'aeiou' or c in 'AEIOU' and False)",
    "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a\n    return a",
    "def largest(xs):\n    best = 0\n    for x in xs:\n        if x < best:\n            best = x\n    return best",
    "def squares(n):\n    return [i * i for i in range(1, n)]",
    "function sum(xs) {\n  let total = 0;\n  for (let i = 1; i < xs.length; i++) total += xs[i];\n  return total;\n}",
    "def is_prime(n):\n    for d in range(2, n):\n        if n % d == 0:\n            return True\n    return n > 1",
    "def merge(a, b):\n    out = a\n    out.extend(b)\n    return sorted(out)",
    "def word_lengths(text):\n    return {w: len(w) for w in text.split(',')}",
)

BUG_FORMS = (
    "This code has a bug. Find it and fix it:\n\n{code}",
    "Why does this function give the wrong answer? Show a corrected version.\n\n{code}",
)

EXPLAIN_FORMS = (
    "Explain what this code does, line by line:\n\n{code}",
    "What does this function return for a small example input? Explain.\n\n{code}",
)

# Stage 1 of the self-written questions: the target writes questions on a topic; stage 2 answers them.
QUESTION_REQUESTS = (
    "Write {n} different questions that a curious student might ask about {t}. Put each question on its own line.",
    "List {n} interesting questions about {t}, one per line, without answers.",
)

# A second user turn on the target's own first answer (multi-turn chats).
FOLLOW_UPS = (
    "Can you give me an example?", "Can you explain that more simply?", "Can you make that shorter?",
    "Tell me more about the first point.", "Why is that?", "What is a common mistake people make here?",
    "Can you summarize your answer in one sentence?", "Is there anything else I should know?",
    "How would you explain this to a child?", "Can you give me a practical tip based on that?",
    "What is a good follow-up question to ask about this?", "Thanks! Can you put that in a list?",
)

# The held-out guard: every term that names a held-out topic or code task, matched as whole words, any case.
# Plural/singular and part-names are listed so that a question the target writes ("How do comets form?") is caught.
HELD_OUT_TERMS = (
    r"eiffel", r"penguins?", r"lightning", r"sahara", r"everest", r"octopus(es)?", r"octopi", r"nile",
    r"wind turbines?", r"violins?", r"origami", r"tsunamis?", r"(human )?skeletons?", r"bees?", r"pollinat\w*",
    r"arctic", r"comets?", r"metric system", r"even numbers?", r"upper ?case letters?", r"(list|array) is sorted",
    r"min(imum)? and (the )?max(imum)?",
)
_HELD_OUT = re.compile(r"\b(" + "|".join(HELD_OUT_TERMS) + r")\b", re.IGNORECASE)


class HeldOutTopic(ValueError):
    """A training prompt that mentions a held-out topic (the evaluation's and the bench's topics)."""


def held_out_mention(text: str) -> str | None:
    """The first held-out term the text mentions, or None."""
    hit = _HELD_OUT.search(text)
    return hit.group(0) if hit else None


def check_prompt(text: str) -> str:
    """The text itself, or HeldOutTopic if it mentions a held-out topic: no training source may ask about one."""
    term = held_out_mention(text)
    if term is not None:
        raise HeldOutTopic(f"training prompt mentions the held-out topic {term!r}: {text[:120]!r}")
    return text


def topic_prompts(held_out: bool = False, seed: int = 0, more: bool = False) -> list[str]:
    """Every form × topic (train) or the held-out topics' prompts, in a fixed shuffled order; `more` adds
    MORE_FORMS (the feature draft's wider data)."""
    topics, code = (HELD_OUT_TOPICS, HELD_OUT_CODE) if held_out else (TOPICS, CODE_TOPICS)
    forms = FORMS + MORE_FORMS if more else FORMS
    out = [f.format(t=t) for t in topics for f in forms] + [f.format(t=t) for t in code for f in CODE_FORMS]
    random.Random(seed).shuffle(out)
    return out
