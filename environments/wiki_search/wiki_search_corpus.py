"""The pages of wiki-search, and a seeded encyclopedia of fictional entities with questions.

Every name is invented (syllables drawn with a seed), so a model cannot know the answers: it
has to search. Facts are placed where an encyclopedia would put them — an inventor's birthplace
in "Early life" of the person's page, the inventor in "History" of the invention's page, a
city's river in "Geography" — and questions chain them: "In which city was the inventor of the
X born?" needs two pages. Each question records the sections on its path (`info["hops"]`).
Distractor facts (where someone retired, which cities trade with which) keep a lucky
keyword match from being enough.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Section:
    section_id: str  # "<page_id>:<heading slug>"
    heading: str
    text: str


@dataclass
class Page:
    page_id: str
    title: str
    sections: list[Section] = field(default_factory=list)


def slugify(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "page"


def make_page(title: str, sections: list[tuple[str, str]], page_id: str | None = None) -> Page:
    """A page from (heading, text) pairs; empty sections are dropped, section ids made unique."""
    page_id = page_id or slugify(title)
    page = Page(page_id, title)
    for heading, text in sections:
        if not text.strip():
            continue
        section_id, n = f"{page_id}:{slugify(heading)}", 2
        while any(s.section_id == section_id for s in page.sections):
            section_id, n = f"{page_id}:{slugify(heading)}-{n}", n + 1
        page.sections.append(Section(section_id, heading, text.strip()))
    return page


_ONSETS = "b br c ch d dr f g gr h j k kr l m n p pr r s st t th tr v w z".split()
_VOWELS = "a e i o u ai ea io ou".split()
_CODAS = ["", "", "n", "r", "l", "s", "th", "m", "nd", "rk"]
_PREFIXES = (
    "aero hydro lumen chrono thermo sono magne helio vapor cryo astro electro gyro pneumo kine".split()
)
_DEVICES = {
    "lathe": "machine tool for shaping wood and metal",
    "wheel": "water-driven wheel for lifting loads",
    "scope": "optical instrument for viewing distant objects",
    "loom": "loom for weaving patterned cloth",
    "press": "press for printing on thin metal sheets",
    "graph": "recorder that traces signals on paper",
    "meter": "instrument for measuring pressure",
    "phone": "device for sending voices along a wire",
    "valve": "valve that regulates the flow of steam",
    "pump": "pump for draining flooded mines",
    "lamp": "lamp that burns without a visible flame",
    "still": "apparatus for purifying water",
}
_PROFESSIONS = [
    "engineer",
    "clockmaker",
    "chemist",
    "physicist",
    "shipwright",
    "astronomer",
    "metallurgist",
    "glassblower",
]
_INDUSTRIES = [
    "shipbuilding",
    "textiles",
    "glassmaking",
    "printing",
    "copper mining",
    "brewing",
    "paper milling",
    "salt trade",
]


class _Names:
    """Unique invented names from a seeded generator."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def word(self, syllables: int) -> str:
        while True:
            parts = [self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) for _ in range(syllables)]
            name = ("".join(parts) + self.rng.choice(_CODAS)).capitalize()
            if name not in self.used and len(name) >= 4:
                self.used.add(name)
                return name


def generate_encyclopedia(num_inventions: int, seed: int) -> tuple[list[Page], list[dict[str, Any]]]:
    """(pages, question rows) for `num_inventions` inventions, each with an inventor; cities,
    companies, rivers and countries scale along."""
    if not 1 <= num_inventions <= len(_PREFIXES) * len(_DEVICES):
        raise ValueError(f"num_inventions must be between 1 and {len(_PREFIXES) * len(_DEVICES)}")
    rng = random.Random(seed)
    names = _Names(rng)
    n_countries, n_rivers = max(2, num_inventions // 10), max(3, num_inventions // 6)
    n_cities, n_companies = max(4, num_inventions // 3), max(3, num_inventions // 5)
    countries = [names.word(2) + rng.choice(["ia", "land", "mark", "ora"]) for _ in range(n_countries)]
    rivers = [f"{names.word(2)} River" for _ in range(n_rivers)]
    cities = [
        {
            "name": names.word(rng.randint(2, 3)),
            "country": rng.choice(countries),
            "river": rng.choice(rivers),
            "founded": rng.randint(900, 1500),
            "industry": rng.choice(_INDUSTRIES),
        }
        for _ in range(n_cities)
    ]
    companies = [
        {
            "name": f"{names.word(2)} {rng.choice(['Works', 'Foundry', 'Instrument Company', 'Manufactory'])}",
            "city": rng.choice(cities),
            "founded": rng.randint(1700, 1800),
        }
        for _ in range(n_companies)
    ]
    kinds = rng.sample([(p, d) for p in _PREFIXES for d in _DEVICES], num_inventions)
    people, inventions = [], []
    for prefix, device in kinds:
        born = rng.randint(1750, 1860)
        person = {
            "name": f"{names.word(rng.randint(1, 2))} {names.word(2)}",
            "born": born,
            "birthplace": rng.choice(cities),
            "retired_to": rng.choice(cities),
            "profession": rng.choice(_PROFESSIONS),
            "employer": rng.choice(companies),
        }
        invention = {
            "name": prefix + device,
            "device": device,
            "inventor": person,
            "year": born + rng.randint(24, 50),
            "maker": rng.choice(companies),
            "place": person["employer"]["city"],
        }
        person["invention"] = invention
        people.append(person)
        inventions.append(invention)

    pages = [
        *(_invention_page(i) for i in inventions),
        *(_person_page(p, rng) for p in people),
        *(_city_page(c, cities, companies, rng) for c in cities),
        *(_company_page(c) for c in companies),
        *(_river_page(r, cities) for r in rivers),
        *(_country_page(c, cities, rivers) for c in countries),
    ]
    return pages, _questions(inventions, people, cities)


def _a(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def _sid(title: str, heading: str) -> str:
    return f"{slugify(title)}:{slugify(heading)}"


def _invention_page(inv: dict[str, Any]) -> Page:
    person, maker = inv["inventor"], inv["maker"]
    return make_page(
        f"The {inv['name']}",
        [
            (
                "Overview",
                f"The {inv['name']} is {_a(_DEVICES[inv['device']])}. It was among the best known "
                f"instruments of its kind in the nineteenth century.",
            ),
            (
                "History",
                f"The {inv['name']} was invented by {person['name']} in {inv['year']}, in the workshops of "
                f"{inv['place']['name']}. Early versions were unreliable and were improved over the next decade.",
            ),
            (
                "Manufacture",
                f"Series production began at the {maker['name']}, which first manufactured the "
                f"{inv['name']} in {inv['year'] + 3}.",
            ),
        ],
    )


def _person_page(p: dict[str, Any], rng: random.Random) -> Page:
    first = p["name"].split()[0]
    return make_page(
        p["name"],
        [
            (
                "Overview",
                f"{p['name']} ({p['born']}–{p['born'] + rng.randint(55, 85)}) was {_a(p['profession'])}, "
                f"remembered today as the inventor of the {p['invention']['name']}.",
            ),
            (
                "Early life",
                f"{first} was born in {p['birthplace']['name']} in {p['born']}, the child of "
                f"{_a(rng.choice(_PROFESSIONS))}, and was apprenticed at the age of fourteen.",
            ),
            (
                "Career",
                f"{first} worked for the {p['employer']['name']} for most of a long career and built the first "
                f"{p['invention']['name']} in {p['invention']['year']}.",
            ),
            (
                "Later years",
                f"In old age {first} retired to {p['retired_to']['name']}, where {first} taught apprentices.",
            ),
        ],
    )


def _city_page(
    c: dict[str, Any], cities: list[dict[str, Any]], companies: list[dict[str, Any]], rng: random.Random
) -> Page:
    partner = rng.choice([o for o in cities if o is not c])
    based = [m["name"] for m in companies if m["city"] is c]
    return make_page(
        c["name"],
        [
            ("Overview", f"{c['name']} is a city in {c['country']}, long known for {c['industry']}."),
            ("Geography", f"{c['name']} lies on the {c['river']}, which made it a busy river port."),
            (
                "History",
                f"{c['name']} was founded in {c['founded']} and traded for centuries with {partner['name']}.",
            ),
            (
                "Economy",
                f"Its economy rests on {c['industry']}."
                + (f" It is home to the {', '.join(based)}." if based else ""),
            ),
        ],
    )


def _company_page(m: dict[str, Any]) -> Page:
    return make_page(
        m["name"],
        [
            ("Overview", f"The {m['name']} is a manufacturer of precision machinery."),
            (
                "History",
                f"The {m['name']} was founded in {m['founded']} and is headquartered in {m['city']['name']}.",
            ),
        ],
    )


def _river_page(river: str, cities: list[dict[str, Any]]) -> Page:
    on = [c["name"] for c in cities if c["river"] == river]
    return make_page(
        f"The {river}",
        [
            (
                "Overview",
                f"The {river} is a river"
                + (f" flowing past {', '.join(on)}." if on else " with no large towns."),
            ),
        ],
    )


def _country_page(country: str, cities: list[dict[str, Any]], rivers: list[str]) -> Page:
    inside = [c["name"] for c in cities if c["country"] == country]
    return make_page(
        country,
        [
            (
                "Overview",
                f"{country} is a country"
                + (f" whose cities include {', '.join(inside)}." if inside else "."),
            ),
        ],
    )


def _questions(
    inventions: list[dict[str, Any]], people: list[dict[str, Any]], cities: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    def add(question: str, answer: Any, *hops: str) -> None:
        rows.append({"question": question, "answer": str(answer), "info": {"hops": list(hops)}})

    for inv in inventions:
        title, person = f"The {inv['name']}", inv["inventor"]
        place = person["birthplace"]
        add(f"Who invented the {inv['name']}?", person["name"], _sid(title, "History"))
        add(f"In what year was the {inv['name']} invented?", inv["year"], _sid(title, "History"))
        add(
            f"Which company first manufactured the {inv['name']}?",
            inv["maker"]["name"],
            _sid(title, "Manufacture"),
        )
        add(
            f"In which city was the inventor of the {inv['name']} born?",
            place["name"],
            _sid(title, "History"),
            _sid(person["name"], "Early life"),
        )
        add(
            f"On which river lies the birthplace of the inventor of the {inv['name']}?",
            place["river"],
            _sid(title, "History"),
            _sid(person["name"], "Early life"),
            _sid(place["name"], "Geography"),
        )
        add(
            f"In which country was the inventor of the {inv['name']} born?",
            place["country"],
            _sid(title, "History"),
            _sid(person["name"], "Early life"),
            _sid(place["name"], "Overview"),
        )
    for person in people:
        add(
            f"In which city was {person['name']} born?",
            person["birthplace"]["name"],
            _sid(person["name"], "Early life"),
        )
        add(
            f"Which company did {person['name']} work for?",
            person["employer"]["name"],
            _sid(person["name"], "Career"),
        )
    for city in cities:
        add(f"In what year was {city['name']} founded?", city["founded"], _sid(city["name"], "History"))
        add(f"In which country is {city['name']}?", city["country"], _sid(city["name"], "Overview"))
    return rows
