"""The 16 documents of the seed-protocol replica (:mod:`benchmarks.paper_replica`), written for this project.

Same genre mix as the seed paper's (Cunningham 2026, arXiv 2602.16760): general
knowledge, two code snippets, medical, legal, two conversational turns, an
HTTP/JSON response, finance, SQL, science, pangrams and climate, about 1,100
tokens in all. The text is our own; none of the seed's paragraphs is reused.
"""

from __future__ import annotations

DOCS: tuple[tuple[str, str], ...] = (
    ("general", "The Danube flows through ten countries, more than any other river in the world. It rises in the "
     "Black Forest of Germany and reaches the Black Sea in Romania after about 2,850 kilometres, passing Vienna, "
     "Bratislava, Budapest and Belgrade on the way."),
    ("general", "Paper was invented in China during the Han dynasty. Cai Lun, a court official, is credited with "
     "improving the process around 105 AD by pulping bark, hemp and old fishing nets. The technique reached "
     "Samarkand in the eighth century and Europe several hundred years later."),
    ("general", "A standard chess board has sixty-four squares arranged in eight ranks and eight files. Each player "
     "starts with sixteen pieces: one king, one queen, two rooks, two bishops, two knights and eight pawns. "
     "The player with the white pieces always moves first, and a game ends in checkmate, resignation or a draw."),
    ("code", "def moving_average(values, window):\n    if window <= 0:\n        raise ValueError('window must be "
     "positive')\n    total = sum(values[:window])\n    out = [total / window]\n    for i in range(window, "
     "len(values)):\n        total += values[i] - values[i - window]\n        out.append(total / window)\n"
     "    return out\n"),
    ("code", "async function fetchUser(id) {\n  const response = await fetch(`/api/users/${id}`);\n  if (!response.ok) "
     "{\n    throw new Error(`request failed: ${response.status}`);\n  }\n  const user = await response.json();\n"
     "  return { name: user.name, email: user.email };\n}\n"),
    ("medical", "Patient presents with a persistent dry cough for three weeks, mild fever in the evenings and "
     "fatigue. Chest auscultation reveals fine crackles at the left base. Plan: chest X-ray, complete blood count, "
     "and a follow-up visit in seven days; start amoxicillin 500 mg three times daily if imaging confirms "
     "pneumonia."),
    ("legal", "The Tenant shall pay the monthly rent on or before the fifth day of each calendar month. If any "
     "payment is more than ten days late, the Landlord may charge a late fee not exceeding five percent of the "
     "amount due. Either party may terminate this agreement with sixty days' written notice."),
    ("chat", "User: Can you suggest something quick for dinner tonight? I only have eggs, spinach and some cheese.\n"
     "Assistant: An omelette would work well. Whisk three eggs, wilt the spinach in a pan, pour the eggs over it "
     "and add the cheese before folding."),
    ("chat", "User: My laptop fan is really loud since yesterday. Should I be worried?\nAssistant: Usually not. "
     "Check whether a background program is using a lot of CPU, make sure the vents are not blocked, and clean "
     "any dust with compressed air if it keeps happening."),
    ("http", 'HTTP/1.1 200 OK\nContent-Type: application/json\nCache-Control: no-store\n\n{"order_id": 48213, '
     '"status": "shipped", "items": [{"sku": "KB-104", "qty": 2}, {"sku": "MS-220", "qty": 1}], '
     '"carrier": "DHL", "estimated_delivery": "2026-03-14"}'),
    ("finance", "Quarterly revenue rose 12 percent year over year to 4.3 billion dollars, driven by subscription "
     "growth, while operating margin narrowed to 18 percent because of higher cloud costs. The board approved a "
     "dividend of 0.42 dollars per share, payable next month."),
    ("sql", "SELECT c.region, COUNT(o.id) AS orders, SUM(o.total) AS revenue\nFROM customers c\nJOIN orders o ON "
     "o.customer_id = c.id\nWHERE o.created_at >= '2025-01-01'\nGROUP BY c.region\nHAVING SUM(o.total) > 10000\n"
     "ORDER BY revenue DESC;"),
    ("science", "Photosynthesis converts light energy into chemical energy. In the chloroplasts, water molecules "
     "are split, releasing oxygen, and the energy captured by chlorophyll is used to fix carbon dioxide into "
     "sugars through the Calvin cycle. "
     "Most of the oxygen in the atmosphere was produced this way over billions of years."),
    ("science", "Sound travels at roughly 343 metres per second in dry air at twenty degrees Celsius, about four "
     "times slower than in water and fifteen times slower than in steel, because the speed depends on how stiff "
     "and how dense the medium is."),
    ("pangram", "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. How vexingly "
     "quick daft zebras jump! Sphinx of black quartz, judge my vow. "
     "Jackdaws love my big sphinx of quartz. The five boxing wizards jump quickly."),
    ("climate", "Global mean surface temperature is now about 1.2 degrees Celsius above the pre-industrial level. "
     "Warmer air holds more moisture, so heavy rainfall events become more intense, while longer dry spells raise "
     "the risk of wildfires in many regions. "
     "Cutting methane, which traps far more heat per tonne than carbon dioxide over twenty years, is one of the "
     "fastest ways to slow the warming."),
)
