"""The generated catalogue: products and goals in WebShop's own file formats.

Five categories (the original's beauty, electronics, fashion, furniture, grocery), four
product types each. A type has the original's fields: a search ``query``, a ``product
category`` path, a pool of attributes and its option types with their values. Around each
goal's target product the generator places near misses, so that reading and clicking matter:

- ``attrs``: the same type and options, one goal attribute swapped for another;
- ``options``: the same product (name, attributes) without the goal's value of one option;
- ``budget``: the same product priced above the goal's price cap;
- ``other``: a product of the same type with random attributes (background).

Products are written as the original's item file (``items_shuffle``-like: ``asin``, ``name``,
``category``, ``query``, ``product_category``, ``full_description``, ``small_description``,
``pricing``, ``customization_options``) and attribute file (``{asin: {"attributes": [...]}}``);
goals carry the original goal fields (``instruction_text``, ``attributes``, ``goal_options``,
``price_upper``, ``query``, ``product_category``, ``name``, ``category``, ``asin``).
"""

from __future__ import annotations

import hashlib
import itertools
import random
import string
from dataclasses import dataclass
from typing import Any

from envs.webshop.reward import normalize_color, token_set_ratio

CATEGORIES = ("beauty", "electronics", "fashion", "furniture", "grocery")
PRICE_RANGE = [10.0 * i for i in range(1, 100)]  # the original's price caps
HELD_OUT_SHARE = 5  # one target product in 5 is held out: its goals are the unseen split


@dataclass(frozen=True)
class ProductType:
    """One product type: the original's ``query`` and ``product_category``, its noun, its
    attribute pool, its option types and a price range."""

    category: str
    query: str
    noun: str
    product_category: str
    attributes: tuple[str, ...]
    options: dict[str, tuple[str, ...]]
    price: tuple[float, float]


_COLORS = ("black", "white", "navy", "red", "green", "grey")


def _t(
    category: str, query: str, noun: str, path: str, attrs: str, options: dict, price: tuple
) -> ProductType:
    return ProductType(
        category, query, noun, path, tuple(a.strip() for a in attrs.split(",")),
        {k: tuple(v) for k, v in options.items()}, price,
    )  # fmt: skip


TYPES: tuple[ProductType, ...] = (
    _t(
        "beauty",
        "shampoo",
        "shampoo",
        "Beauty & Personal Care › Hair Care › Shampoo & Conditioner › Shampoos",
        "sulfate free, paraben free, dry hair, hair growth, cruelty free, tea tree oil, "
        "damaged hair, argan oil",
        {"size": ("8 fl oz", "16 fl oz", "32 fl oz"), "scent": ("coconut", "citrus", "unscented")},
        (6, 30),
    ),
    _t(
        "beauty",
        "lipstick",
        "lipstick",
        "Beauty & Personal Care › Makeup › Lips › Lipstick",
        "long lasting, matte finish, vitamin e, vegan formula, waterproof, moisturizing, "
        "high pigment, sensitive lips",
        {"color": ("red", "coral", "plum", "nude")},
        (5, 25),
    ),
    _t(
        "beauty",
        "face moisturizer",
        "moisturizer",
        "Beauty & Personal Care › Skin Care › Face › Creams & Moisturizers",
        "oil free, hyaluronic acid, fragrance free, anti aging, oily skin, spf 30, "
        "non comedogenic, vitamin c",
        {"size": ("1.7 oz", "3.4 oz", "5 oz")},
        (10, 45),
    ),
    _t(
        "beauty",
        "nail polish",
        "nail polish",
        "Beauty & Personal Care › Foot, Hand & Nail Care › Nail Polish",
        "quick dry, chip resistant, non toxic, gel look, glossy shine, cruelty free, "
        "easy removal, salon quality",
        {"color": ("red", "pink", "black", "white", "teal")},
        (4, 18),
    ),
    _t(
        "electronics",
        "wireless headphones",
        "headphones",
        "Electronics › Headphones, Earbuds & Accessories › Headphones › Over-Ear Headphones",
        "noise cancelling, bluetooth 5, hands free calling, deep bass, foldable design, "
        "long battery life, built in microphone, memory foam",
        {"color": ("black", "white", "navy", "red")},
        (25, 120),
    ),
    _t(
        "electronics",
        "phone case",
        "phone case",
        "Cell Phones & Accessories › Cases, Holsters & Sleeves › Basic Cases",
        "shockproof, slim fit, wireless charging compatible, card holder, kickstand, "
        "raised edges, anti scratch, military grade",
        {"color": _COLORS, "model": ("iphone 13", "galaxy s21", "pixel 6")},
        (6, 28),
    ),
    _t(
        "electronics",
        "usb charger",
        "charger",
        "Electronics › Computers & Accessories › Chargers & Adapters",
        "fast charging, dual port, foldable plug, overheat protection, compact size, "
        "usb c, travel ready, led indicator",
        {"color": ("black", "white"), "wattage": ("20w", "45w", "65w")},
        (9, 40),
    ),
    _t(
        "electronics",
        "bluetooth speaker",
        "speaker",
        "Electronics › Portable Audio & Video › Portable Bluetooth Speakers",
        "water resistant, stereo sound, outdoor use, long battery life, built in microphone, "
        "shock resistant, party lights, usb charging",
        {"color": ("black", "blue", "red", "green")},
        (15, 90),
    ),
    _t(
        "fashion",
        "men's t-shirt",
        "t-shirt",
        "Clothing, Shoes & Jewelry › Men › Clothing › Shirts › T-Shirts",
        "short sleeve, cotton blend, machine wash, crew neck, regular fit, moisture wicking, "
        "tagless label, relaxed fit",
        {"color": _COLORS, "size": ("small", "medium", "large")},
        (8, 30),
    ),
    _t(
        "fashion",
        "women's running shoes",
        "running shoes",
        "Clothing, Shoes & Jewelry › Women › Shoes › Athletic › Running",
        "non slip, arch support, breathable mesh, memory foam, rubber sole, lace up, "
        "shock absorption, wide toe box",
        {"color": ("black", "white", "pink", "grey"), "size": ("6", "7", "8", "9")},
        (30, 95),
    ),
    _t(
        "fashion",
        "winter jacket",
        "jacket",
        "Clothing, Shoes & Jewelry › Women › Clothing › Coats, Jackets & Vests",
        "water resistant, hooded, fleece lined, zip closure, windproof, machine wash, "
        "faux fur trim, warm lining",
        {"color": ("black", "navy", "olive", "burgundy"), "size": ("small", "medium", "large")},
        (40, 150),
    ),
    _t(
        "fashion",
        "leather wallet",
        "wallet",
        "Clothing, Shoes & Jewelry › Men › Accessories › Wallets, Card Cases & Money Organizers",
        "rfid blocking, genuine leather, slim design, coin pocket, id window, gift box, "
        "bifold style, multiple card slots",
        {"color": ("black", "brown", "tan")},
        (12, 45),
    ),
    _t(
        "furniture",
        "office chair",
        "office chair",
        "Home & Kitchen › Furniture › Home Office Furniture › Home Office Chairs",
        "lumbar support, adjustable height, swivel wheels, mesh back, padded armrests, "
        "easy assembly, weight capacity 300 lbs, tilt lock",
        {"color": ("black", "grey", "white")},
        (60, 250),
    ),
    _t(
        "furniture",
        "bookshelf",
        "bookshelf",
        "Home & Kitchen › Furniture › Living Room Furniture › Bookcases",
        "5 tier, easy assembly, industrial style, space saving, anti tip kit, engineered wood, "
        "open shelves, metal frame",
        {"color": ("walnut", "white", "black"), "width": ("narrow", "wide")},
        (35, 160),
    ),
    _t(
        "furniture",
        "coffee table",
        "coffee table",
        "Home & Kitchen › Furniture › Living Room Furniture › Tables › Coffee Tables",
        "lift top, storage shelf, solid wood legs, round shape, mid century, easy assembly, "
        "scratch resistant, hidden compartment",
        {"color": ("walnut", "oak", "white", "black")},
        (50, 220),
    ),
    _t(
        "furniture",
        "bed frame",
        "bed frame",
        "Home & Kitchen › Furniture › Bedroom Furniture › Beds, Frames & Bases",
        "no box spring needed, under bed storage, noise free, metal slats, upholstered "
        "headboard, easy assembly, heavy duty, tool free",
        {"size": ("twin", "queen", "king")},
        (80, 300),
    ),
    _t(
        "grocery",
        "green tea",
        "green tea",
        "Grocery & Gourmet Food › Beverages › Tea › Green Tea",
        "organic, caffeine free, gluten free, non gmo, individually wrapped, loose leaf, "
        "sugar free, antioxidant rich",
        {"flavor": ("jasmine", "mint", "lemon ginger", "matcha"), "size": ("20 bags", "100 bags")},
        (4, 24),
    ),
    _t(
        "grocery",
        "protein bar",
        "protein bar",
        "Grocery & Gourmet Food › Snack Foods › Bars › Protein Bars",
        "gluten free, low sugar, high protein, plant based, keto friendly, dairy free, "
        "non gmo, soy free",
        {
            "flavor": ("chocolate chip", "peanut butter", "cookie dough"),
            "size": ("box of 12", "case of 24"),
        },
        (12, 40),
    ),
    _t(
        "grocery",
        "coffee beans",
        "coffee beans",
        "Grocery & Gourmet Food › Beverages › Coffee › Whole Coffee Beans",
        "medium roast, dark roast, fair trade, single origin, low acid, usda organic, "
        "small batch, kosher certified",
        {"size": ("12 ounce", "2 pound", "kilogram bag")},
        (9, 55),
    ),
    _t(
        "grocery",
        "olive oil",
        "olive oil",
        "Grocery & Gourmet Food › Pantry Staples › Cooking & Baking › Oils › Olive Oil",
        "extra virgin, cold pressed, first harvest, glass bottle, non gmo, kosher certified, "
        "usda organic, low acidity",
        {"size": ("500 ml", "1 liter", "gallon jug")},
        (8, 45),
    ),
)

_SYLLABLES = (
    "ve",
    "lo",
    "ra",
    "zen",
    "ta",
    "mi",
    "ko",
    "lu",
    "na",
    "pri",
    "so",
    "dex",
    "va",
    "quo",
    "bel",
)
_OPENINGS = ("i am looking for", "i need", "i want to buy", "find me", "i'm searching for")
_FEATURE_TAILS = (
    "made to last through everyday use",
    "checked by our quality team",
    "a favourite of our customers",
    "designed with care",
)


def check_types(types: tuple[ProductType, ...] = TYPES) -> None:
    """Fail loud if two attributes of a type could match each other (fuzzy score above 85,
    or one contained in the other) or two values of an option could, after colour
    normalisation: a near miss would then score as the target."""
    for t in types:
        for a, b in itertools.combinations(t.attributes, 2):
            if token_set_ratio(a, b) > 85 or a in b or b in a:
                raise ValueError(f"{t.query}: attributes {a!r} and {b!r} match each other")
        for name, values in t.options.items():
            for a, b in itertools.combinations(values, 2):
                if token_set_ratio(normalize_color(a), normalize_color(b)) > 85:
                    raise ValueError(f"{t.query}: {name} values {a!r} and {b!r} match")


def stable_hash(text: str) -> int:
    """A process-independent 64-bit hash."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def _asin(rng: random.Random, used: set[str]) -> str:
    while True:
        asin = "B0" + "".join(rng.choices(string.ascii_uppercase + string.digits, k=8))
        if asin not in used:
            used.add(asin)
            return asin


def _brand(rng: random.Random) -> str:
    return "".join(rng.choices(_SYLLABLES, k=rng.choice((2, 3)))).capitalize()


def _title_case(text: str) -> str:
    return " ".join(w if w[:1].isdigit() else w[:1].upper() + w[1:] for w in text.split())


def _item(
    asin: str, t: ProductType, brand: str, attrs: list[str], options: dict[str, list[str]],
    price: float, rng: random.Random,
) -> tuple[dict[str, Any], list[str]]:  # fmt: skip
    """One product in the original's item format, and its attributes."""
    name = f"{brand} {_title_case(attrs[0])} {_title_case(t.noun)}"
    bullets = [f"{_title_case(a)}: {rng.choice(_FEATURE_TAILS)}." for a in attrs]
    description = (
        f"The {brand} {t.noun} is {', '.join(attrs[:-1])} and {attrs[-1]}. "
        f"Order the {t.noun} that fits your needs."
    )
    item = {
        "asin": asin,
        "name": name,
        "category": t.category,
        "query": t.query,
        "product_category": t.product_category,
        "full_description": description,
        "small_description": bullets,
        "pricing": f"${price:.2f}",
        "customization_options": {
            k: [{"value": v, "image": None} for v in vs] for k, vs in options.items()
        },
        "images": [],
    }
    return item, list(attrs)


def price_upper_for(price: float, rng: random.Random) -> float:
    """The original's price cap: two of the four round prices above ``price``, the larger."""
    above = [p for p in PRICE_RANGE if p > price][:4]
    if len(above) < 2:
        return 1000000.0
    return max(rng.sample(above, 2))


@dataclass
class Catalog:
    """Generated products (item and attribute files) and goal candidates per target."""

    items: list[dict[str, Any]]
    attributes: dict[str, dict[str, list[str]]]
    goals: list[dict[str, Any]]  # two per target (variant 0, 1), with "held_out", "near_misses"


def _goal(
    t: ProductType, target: dict[str, Any], attrs: list[str], options: dict[str, str],
    price_upper: float, rng: random.Random,
) -> dict[str, Any]:  # fmt: skip
    """A goal in the original's fields (goal options as a list, as human goals store them)."""
    option_text = " and ".join(f"{v} {k}" for k, v in options.items())
    wanted = " and ".join(attrs)
    text = f"{rng.choice(_OPENINGS)} {wanted} {t.noun} with {option_text}"
    return {
        "asin": target["asin"],
        "category": t.category,
        "query": t.query,
        "name": target["name"],
        "product_category": t.product_category,
        "instruction_text": f"{text}, and price lower than {price_upper:.2f} dollars",
        "attributes": list(attrs),
        "goal_options": list(options.values()),
        "goal_options_by_name": dict(options),
        "price_upper": price_upper,
        # the expert's searches, in order: the instruction's own words for the product, then
        # with the option values (when the first does not show the product on page 1)
        "search_queries": [f"{wanted} {t.noun}", f"{wanted} {t.noun} {' '.join(options.values())}"],
    }


def build_catalog(seed: int, targets_per_type: int = 30) -> Catalog:
    """The catalogue of ``seed``: per type, ``targets_per_type`` targets, each with its near
    misses and a background product (5 products each: 3,000 at the default), and two goals
    per target: variant 0 (the near misses are built around it) and variant 1 (another
    attribute subset, options and price cap). Deterministic in (seed, targets_per_type)."""
    check_types()
    if targets_per_type < 1:
        raise ValueError(f"targets_per_type must be >= 1, got {targets_per_type}")
    rng = random.Random(f"webshop-catalog:{seed}")
    used: set[str] = set()
    items: list[dict[str, Any]] = []
    attributes: dict[str, dict[str, list[str]]] = {}
    goals: list[dict[str, Any]] = []

    def add(t, brand, attrs, options, price) -> dict[str, Any]:
        item, attr = _item(_asin(rng, used), t, brand, attrs, options, price, rng)
        items.append(item)
        attributes[item["asin"]] = {"attributes": attr}
        return item

    for t in TYPES:
        for _ in range(targets_per_type):
            n_attrs = rng.choice((3, 4))
            attrs = rng.sample(list(t.attributes), n_attrs)
            options = {
                k: rng.sample(list(vs), min(len(vs), rng.choice((2, 3, 4))))
                for k, vs in t.options.items()
            }
            price = round(rng.uniform(*t.price), 2)
            brand = _brand(rng)
            target = add(t, brand, attrs, options, price)
            wanted_attrs = rng.sample(attrs, rng.choice((2, 3)) if n_attrs > 2 else 2)
            wanted_options = {k: rng.choice(vs) for k, vs in options.items()}
            upper = price_upper_for(price, rng)
            goal = _goal(t, target, wanted_attrs, wanted_options, upper, rng)
            # near misses
            swap = rng.choice(wanted_attrs)
            spare = [a for a in t.attributes if a not in attrs]
            twin_attrs = [rng.choice(spare) if a == swap else a for a in attrs]
            misses = {"attrs": add(t, _brand(rng), twin_attrs, options, price)["asin"]}
            dropped = rng.choice(sorted(options))
            others = [v for v in t.options[dropped] if v != wanted_options[dropped]]
            twin_options = dict(options)
            twin_options[dropped] = rng.sample(others, min(len(others), 2))
            misses["options"] = add(t, brand, attrs, twin_options, price)["asin"]
            over = round(upper + rng.uniform(3, 25), 2)
            misses["budget"] = add(t, brand, attrs, options, over)["asin"]
            other = rng.sample(list(t.attributes), n_attrs)
            misses["other"] = add(t, _brand(rng), other, options, round(rng.uniform(*t.price), 2))[
                "asin"
            ]
            held_out = stable_hash(f"{seed}:{target['asin']}") % HELD_OUT_SHARE == 0
            second = _goal(
                t, target, rng.sample(attrs, len(wanted_attrs)),
                {k: rng.choice(vs) for k, vs in options.items()}, price_upper_for(price, rng), rng,
            )  # fmt: skip
            for variant, g in enumerate((goal, second)):
                g.update(near_misses=misses, held_out=held_out, variant=variant)
                g["goal_id"] = f"{t.category}-{target['asin'].lower()}-{variant}"
                goals.append(g)
    order = random.Random(f"webshop-shuffle:{seed}")
    order.shuffle(items)  # as items_shuffle: no product's neighbours give its goal away
    return Catalog(items, attributes, goals)
