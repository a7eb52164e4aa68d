"""The official WebShop data from a user's folder: item, attribute and human-instruction files
-> this environment's task folder.

Files (the names the original's ``web_agent_site/utils.py`` uses; the first one present):
items ``items_shuffle_1000.json`` or ``items_shuffle.json`` (a JSON list of products),
attributes ``items_ins_v2_1000.json`` or ``items_ins_v2.json`` (``{asin: {"attributes": [...],
...}}``), human goals ``items_human_ins.json`` (``{asin: [{"instruction",
"instruction_attributes", "instruction_options"}, ...]}``).

Goals follow the original's ``get_human_goals``: an instruction without attributes is
skipped; the price cap is two of the four round prices above the product's price, the larger,
with ``, and price lower than X dollars`` appended (no cap when fewer than two exist); the
goal's name, query, category and product category are its product's. The goals are shuffled
with the original's seed (233) and split as its text environment splits them: the first 500
are ``unseen`` (its test goals), the next 1,000 ``seen`` (its development goals), the rest
``train``; ``all`` keeps every goal. ``out/shop.json`` names the user's files by absolute path.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

from envs.webshop.catalog import price_upper_for
from envs.webshop.shop import ShopError, load_shop
from envs.webshop.tasks import SHOP_CONFIG, TaskError, plan_for

ITEM_FILES = ("items_shuffle_1000.json", "items_shuffle.json")
ATTRIBUTE_FILES = ("items_ins_v2_1000.json", "items_ins_v2.json")
HUMAN_FILE = "items_human_ins.json"
SPLIT_RANGES = {"unseen": (0, 500), "seen": (500, 1500), "train": (1500, None), "all": (0, None)}
SHUFFLE_SEED = 233  # the original's SimServer shuffles its goals with this seed


def _first(folder: Path, names: tuple[str, ...], what: str) -> Path:
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise TaskError(f"{folder}: no {what} file (looked for {', '.join(names)})")


def human_goals(products: dict[str, dict[str, Any]], human: Any, seed: int) -> list[dict[str, Any]]:
    """The goals of the human-instruction file, in file order."""
    if not isinstance(human, dict):
        raise TaskError(f"{HUMAN_FILE}: a JSON object by asin")
    rng = random.Random(f"webshop-official-prices:{seed}")
    goals = []
    for asin, instructions in human.items():
        if asin not in products:
            continue
        product = products[asin]
        for k, ins in enumerate(instructions or []):
            if not isinstance(ins, dict) or "instruction" not in ins:
                raise TaskError(f"{HUMAN_FILE}: {asin} instruction {k} has no 'instruction'")
            attributes = list(ins.get("instruction_attributes") or [])
            if not attributes:
                continue
            upper = price_upper_for(product["price"], rng)
            price_text = f", and price lower than {upper:.2f} dollars" if upper < 1000000 else ""
            goals.append(
                {
                    "asin": asin, "category": product["category"], "query": product["query"],
                    "name": product["name"], "product_category": product["product_category"],
                    "instruction_text": str(ins["instruction"]).strip(".") + price_text,
                    "attributes": attributes,
                    "goal_options": [str(o) for o in ins.get("instruction_options") or []],
                    "price_upper": upper,
                    "goal_id": re.sub(r"[^A-Za-z0-9_-]+", "_", f"{asin.lower()}-{k}"),
                }
            )  # fmt: skip
    return goals


def convert_official(
    folder: str | Path, out: str | Path, split: str, n: int | None = None, seed: int = 0
) -> list[Path]:
    """Write the official human goals of ``split`` as goal files under ``out``; their paths."""
    if split not in SPLIT_RANGES:
        raise TaskError(
            f"unknown split {split!r} for official data; choose from {list(SPLIT_RANGES)}"
        )
    folder = Path(folder)
    if not folder.is_dir():
        raise TaskError(f"--from-official {folder}: no such folder")
    items = _first(folder, ITEM_FILES, "item").resolve()
    attrs = _first(folder, ATTRIBUTE_FILES, "attribute").resolve()
    human_path = folder / HUMAN_FILE
    if not human_path.is_file():
        raise TaskError(f"{folder}: no human-instruction file {HUMAN_FILE}")
    try:
        shop = load_shop(items, attrs)
        human = json.loads(human_path.read_text(encoding="utf-8"))
    except ShopError as err:
        raise TaskError(str(err)) from None
    except json.JSONDecodeError as err:
        raise TaskError(
            f"{human_path}: not a whole JSON file ({err.msg} at line {err.lineno})"
        ) from None
    goals = human_goals(shop.by_asin, human, seed)
    random.Random(SHUFFLE_SEED).shuffle(goals)
    start, stop = SPLIT_RANGES[split]
    goals = goals[start:stop][:n] if n is not None else goals[start:stop]
    if not goals:
        raise TaskError(f"{human_path}: no goals in the {split} split")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = {"items": str(items), "attributes": str(attrs), "source": "official"}
    existing = out / SHOP_CONFIG
    if existing.exists() and json.loads(existing.read_text()) != config:
        raise TaskError(f"{existing} names another shop; write these goals to another folder")
    existing.write_text(json.dumps(config, indent=1) + "\n")
    paths = []
    for goal in goals:
        product = shop.by_asin[goal["asin"]]
        goal["plan"] = plan_for(
            shop, goal, [goal["instruction_text"].split(", and price")[0], product["Title"]]
        )
        goal["split"] = split
        category = re.sub(r"[^A-Za-z0-9_-]+", "_", goal["category"]) or "other"
        path = out / split / category / f"{goal['goal_id']}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(goal, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        paths.append(path)
    return paths
