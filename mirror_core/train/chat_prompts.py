"""Chat-style prompts for distilling a draft from an instruct target: the target's own answers to these are the
draft's training text (sequence-level distillation). Prompts are instruction forms × topics; the held-out topics
(used for evaluation and the benchmark's chat prompts) never appear in training prompts."""
from __future__ import annotations

import random

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

# More varied forms (issue 28: the first draft plateaued on FORMS alone): other registers, lengths and tasks.
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


def prompts(held_out: bool = False, seed: int = 0, more: bool = False) -> list[str]:
    """Every form × topic (train) or the held-out topics' prompts, in a fixed shuffled order; `more` adds
    MORE_FORMS (the feature draft's wider data)."""
    topics, code = (HELD_OUT_TOPICS, HELD_OUT_CODE) if held_out else (TOPICS, CODE_TOPICS)
    forms = FORMS + MORE_FORMS if more else FORMS
    out = [f.format(t=t) for t in topics for f in forms] + [f.format(t=t) for t in code for f in CODE_FORMS]
    random.Random(seed).shuffle(out)
    return out
