"""WebShop's purchase reward, written from the original's definition.

Source read: princeton-nlp/WebShop ``web_agent_site/engine/goal.py`` (``get_reward``,
``get_type_reward``, ``get_attribute_reward``, ``get_option_reward``) and
``engine/normalize.py`` (``normalize_color``) at commit
64fa2a5c15c7daa698b9ac93f5bb5437b634c9bd. With A goal attributes, O goal options:

    reward = r_type * (n_attr + n_option + [price <= price_upper]) / (A + O + 1)

- ``n_attr``: goal attributes g for which some product attribute p has
  ``token_set_ratio(p, g) > 85``, or else g is a substring of the lower-cased title, the
  joined bullet points (Features) or the description.
- ``n_option``: goal options g (colour-normalised) for which some chosen option value p
  (colour-normalised) has ``token_set_ratio(p, g) > 85``.
- ``r_type`` from the product type: ``query_match`` (same search query), ``category_match``
  (at least two shared levels of the ``a › b › c`` product category), ``title_score`` (the
  share of the goal product name's nouns found in the bought product's name). 1.0; 0.5 when
  none of the three matches (``title_score > 0.2`` counts as a match); 0.1 when
  ``title_score < 0.1``; 0.0 when it is 0.

Success is reward exactly 1.0.

Departures, both forced by what can be installed here:
- Nouns: the original tags the names with spaCy's ``en_core_web_sm`` (NOUN, PROPN). spaCy
  models are not on the package index, so by default ``nouns`` is a deterministic heuristic:
  every alphabetic word of two or more letters that is not in ``NON_NOUNS`` (function words,
  colours, sizes, materials and common product adjectives). Set ``WEBSHOP_SPACY_MODEL`` to a
  spaCy model's folder (with spaCy installed) to tag with it instead, as the original does.
- Fuzzy matching: ``token_set_ratio`` is thefuzz's (>= 0.20, on rapidfuzz) scorer written
  here in pure Python (a test checks it against thefuzz 0.22.1 on the shop's words), so the
  environment needs no compiled dependency: lower case, non-alphanumerics to spaces, the token sets' sorted
  intersection ``t0`` and ``t1 = t0 + diff_ab``, ``t2 = t0 + diff_ba``; the score is the
  largest Indel similarity ``100 * 2 * LCS / (len_a + len_b)`` of the pairs (t0, t1),
  (t0, t2), (t1, t2), rounded to an integer; 0 when either side has no token.

Goal options are a list of values (as the human goals store them). The original's
synthetic goals store a dict and pass its ``(name, value)`` items to the option match; a
dict here is read by its values.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ATTR_THRESHOLD = 85  # a fuzzy match needs a score above this (the original's `> 85`)
OPTION_THRESHOLD = 85
SPACY_ENV = "WEBSHOP_SPACY_MODEL"

# normalize_color's colours, in the original's order: the first one that is a substring of
# an option value replaces it ("dark blue" -> "blue", "navy blue" -> "blue")
_COLOR_WORDS = (
    "alabaster apricot aqua ash asphalt azure banana beige black blue blush bordeaux bronze "
    "brown burgundy camel camo caramel champagne charcoal cheetah chestnut chocolate christmas "
    "coffee cognac copper coral cranberry cream crystal dark denim eggplant elephant espresso "
    "fuchsia gold granite grape graphite grass gray green grey heather indigo ivory ivy khaki "
    "lavender lemon leopard light lilac lime magenta maroon mauve merlot midnight mint mocha "
    "multicolor mushroom mustard natural navy nude olive orange peach pewter pink plum purple "
    "rainbow red rose royal rust sand sapphire seashell silver skull slate steel stone "
    "stonewash sunflower tan taupe teal tiger turquoise violet walnut wheat white wine yellow"
)
COLOR_SET = tuple(_COLOR_WORDS.split())

_NON_NOUN_WORDS = (
    "a an and the of for with in on to by or from at as is are be this that these those "
    "it its your our my his her their all any each every no not only very more most new "
    "s men women mens womens kids unisex adult adults girls boys "
    "small medium large extra mini big long short tall wide slim thin thick heavy light "
    "lightweight soft hard warm cool hot cold fresh natural organic pure premium classic "
    "modern vintage casual formal portable compact durable waterproof wireless rechargeable "
    "adjustable comfortable breathable stretchy quick easy high low super ultra best great "
    "black white red blue green yellow pink purple grey gray brown beige navy orange silver "
    "gold cotton leather wooden wood metal plastic glass steel stainless bamboo wool silk "
    "pack set piece pcs count oz fl ml inch inches ft cm mm lb lbs"
)
NON_NOUNS = frozenset(_NON_NOUN_WORDS.split())

_NON_ALNUM = re.compile(r"[^0-9a-z]+")
_WORD = re.compile(r"[a-z]+")


# ------------------------------------------------------------------------- fuzzy matching


def _process(text: str) -> str:
    """thefuzz's default processing: lower case, every non-alphanumeric a space, stripped."""
    return _NON_ALNUM.sub(" ", str(text).lower()).strip()


@functools.lru_cache(maxsize=65536)
def _lcs(a: str, b: str) -> int:
    """Length of the longest common subsequence of two strings."""
    if len(a) < len(b):
        a, b = b, a
    previous = [0] * (len(b) + 1)
    for ch in a:
        current = [0]
        for j, other in enumerate(b):
            current.append(previous[j] + 1 if ch == other else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


def ratio(a: str, b: str) -> float:
    """Indel similarity in [0, 100]: ``100 * 2 * LCS(a, b) / (len(a) + len(b))``; two empty
    strings are 100."""
    if not a and not b:
        return 100.0
    return 100.0 * 2 * _lcs(a, b) / (len(a) + len(b))


def token_set_ratio(a: str, b: str) -> int:
    """thefuzz's ``fuzz.token_set_ratio`` (see the module docstring)."""
    tokens_a, tokens_b = set(_process(a).split()), set(_process(b).split())
    if not tokens_a or not tokens_b:
        return 0
    t0 = " ".join(sorted(tokens_a & tokens_b))
    t1 = " ".join(filter(None, [t0, " ".join(sorted(tokens_a - tokens_b))]))
    t2 = " ".join(filter(None, [t0, " ".join(sorted(tokens_b - tokens_a))]))
    scores = [ratio(t1, t2)]
    if t0:
        scores += [ratio(t0, t1), ratio(t0, t2)]
    return round(max(scores))


def normalize_color(value: str) -> str:
    """The first colour of ``COLOR_SET`` that is a substring of ``value``, else ``value``."""
    for color in COLOR_SET:
        if color in value:
            return color
    return value


# ------------------------------------------------------------------------- type reward


@functools.lru_cache(maxsize=1)
def _spacy_model() -> Any:
    path = os.environ.get(SPACY_ENV)
    if not path:
        return None
    import spacy  # only when a model is named

    return spacy.load(path)


@functools.lru_cache(maxsize=65536)
def nouns(name: str) -> tuple[str, ...]:
    """The nouns of a product name, lower case (see the module docstring for which tagger)."""
    model = _spacy_model()
    if model is not None:
        return tuple(t.text.lower() for t in model(name) if t.pos_ in ("NOUN", "PROPN"))
    return tuple(w for w in _WORD.findall(name.lower()) if len(w) > 1 and w not in NON_NOUNS)


def _category_levels(product_category: str) -> set[str]:
    return {x.strip() for x in product_category.split("›")}


def type_reward(product: Mapping[str, Any], goal: Mapping[str, Any]) -> dict[str, Any]:
    """``r_type`` and its parts (``query_match``, ``category_match``, ``title_score``)."""
    query_match = product["query"] == goal["query"]
    category_match = (
        len(
            _category_levels(product["product_category"])
            & _category_levels(goal["product_category"])
        )
        >= 2
    )
    bought, wanted = set(nouns(product["name"])), nouns(goal["name"])
    # the shared distinct nouns over the goal name's nouns, repeats counted (as the original)
    title_score = len(bought & set(wanted)) / len(wanted) if wanted else 0.2
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {
        "r_type": r_type,
        "query_match": query_match,
        "category_match": category_match,
        "title_score": title_score,
    }


# ------------------------------------------------------------------------- attributes, options


def attribute_matches(product: Mapping[str, Any], goal_attributes: Sequence[str]) -> int:
    """How many goal attributes the product has (fuzzy in its attributes, else verbatim in
    its title, features or description)."""
    title = product["Title"].lower()
    features = " ".join(product["BulletPoints"]).lower()
    description = product["Description"].lower()
    count = 0
    for wanted in goal_attributes:
        fuzzy = any(token_set_ratio(p, wanted) > ATTR_THRESHOLD for p in product["Attributes"])
        if fuzzy or wanted in title or wanted in features or wanted in description:
            count += 1
    return count


def _option_values(options: Mapping[str, str] | Iterable[str]) -> list[str]:
    values = options.values() if isinstance(options, Mapping) else options
    return [str(v) for v in values]


def option_matches(chosen: Iterable[str], goal_options: Iterable[str]) -> int:
    """How many goal options one of the chosen option values matches (colour-normalised)."""
    bought = [normalize_color(o) for o in chosen]
    count = 0
    for wanted in (normalize_color(o) for o in goal_options):
        if any(token_set_ratio(p, wanted) > OPTION_THRESHOLD for p in bought):
            count += 1
    return count


@dataclass(frozen=True)
class Reward:
    """A purchase's reward and its parts."""

    total: float
    r_type: float
    attr_matches: int
    option_matches: int
    price_ok: bool
    n_attrs: int
    n_options: int
    type_parts: dict[str, Any]

    @property
    def won(self) -> bool:
        """Success: reward exactly 1."""
        return self.total == 1.0


def get_reward(
    product: Mapping[str, Any],
    goal: Mapping[str, Any],
    price: float,
    options: Mapping[str, str] | Sequence[str],
) -> Reward:
    """The reward of buying ``product`` at ``price`` with the chosen ``options`` (option
    name -> value) for ``goal`` (fields ``query``, ``product_category``, ``name``,
    ``attributes``, ``goal_options``, ``price_upper``)."""
    parts = type_reward(product, goal)
    goal_options = _option_values(goal["goal_options"])
    n_attr = attribute_matches(product, goal["attributes"])
    n_opt = option_matches(_option_values(options), goal_options)
    price_ok = float(price) <= float(goal["price_upper"])
    denominator = len(goal["attributes"]) + len(goal_options) + 1
    total = (n_attr + n_opt + int(price_ok)) / denominator * parts["r_type"]
    return Reward(
        total, parts["r_type"], n_attr, n_opt, price_ok, len(goal["attributes"]),
        len(goal_options), parts,
    )  # fmt: skip
