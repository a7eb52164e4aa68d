"""The shop: products read from WebShop's file formats, BM25 search, and the pages.

Loading follows the original's ``load_products`` (princeton-nlp/WebShop
``web_agent_site/engine/engine.py`` at 64fa2a5c15c7daa698b9ac93f5bb5437b634c9bd): an asin
``"nan"`` or longer than 10 characters and a repeated asin are skipped; ``Title`` is the
``name``, ``Description`` the ``full_description``, ``BulletPoints`` the
``small_description`` (a string becomes a one-item list); ``pricing`` ``"$a"`` or ``"$a$b"``
(none: $100.0) gives the price tag; option names are lower-cased, option values stripped,
lower-cased, ``/`` written `` | ``; ``Attributes`` come from the attribute file (none:
``["DUMMY_ATTR"]``). A product with a price range is sold at a uniform draw from it, as the
original's ``generate_product_prices`` draws, but seeded by its asin so every process agrees.

Search: the original indexes ``Title Description BulletPoints[0] options-text`` (lower case)
with Lucene and shows the top 50 hits, 10 a page. Here bm25s (BM25, as Lucene scores) indexes
the same text; hits of score 0 are not results (Lucene returns only matching documents).

Pages and clicks are the original's ``SimServer.receive``: the search page; results with
``Back to Search``, ``< Prev`` (after page 1), ``Next >`` (always) and each product's asin;
the item page with ``Back to Search``, ``< Prev``, each option value, ``Description``,
``Features``, ``Reviews``, ``Buy Now``; a sub page with ``Back to Search`` and ``< Prev``.
Clickable names are lower case (asins too). Showing results resets the chosen options.
"""

from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

SEARCH_RETURN_N = 50
PRODUCT_WINDOW = 10
BACK_TO_SEARCH = "back to search"
NEXT_PAGE = "next >"
PREV_PAGE = "< prev"
BUY_NOW = "buy now"
SUB_PAGES = ("description", "features", "reviews")
SEP = " [SEP] "
_REQUIRED_ITEM = ("asin", "name", "category", "query", "product_category")


class ShopError(ValueError):
    """A product file that cannot be read, or an unknown product (one line)."""


# --------------------------------------------------------------------------- loading


def _read_json(path: str | os.PathLike, what: str) -> Any:
    path = Path(path)
    if not path.is_file():
        raise ShopError(f"no {what} file {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ShopError(
            f"{path}: not a whole JSON {what} file ({err.msg} at line {err.lineno})"
        ) from None
    except UnicodeDecodeError as err:
        raise ShopError(f"{path}: not UTF-8 ({err.reason})") from None


def _pricing(raw: Any, asin: str) -> tuple[list[float], str]:
    if not raw:
        return [100.0], "$100.0"
    try:
        prices = [float(Decimal(re.sub(r"[^\d.]", "", p))) for p in str(raw).split("$")[1:]]
    except InvalidOperation:
        raise ShopError(f"product {asin}: unreadable pricing {raw!r}") from None
    if not prices:
        raise ShopError(f"product {asin}: unreadable pricing {raw!r}")
    if len(prices) == 1:
        return prices, f"${prices[0]}"
    return prices[:2], f"${prices[0]} to ${prices[1]}"


def _options(raw: Any) -> dict[str, list[str]]:
    options: dict[str, list[str]] = {}
    for name, contents in (raw or {}).items():
        if contents is None:
            continue
        options[str(name).lower()] = [
            str(c["value"]).strip().replace("/", " | ").lower() for c in contents
        ]
    return options


def load_products(
    items_path: str | os.PathLike, attributes_path: str | os.PathLike | None = None
) -> list[dict[str, Any]]:
    """The products of an item file (and attribute file), in file order."""
    items = _read_json(items_path, "item")
    if not isinstance(items, list):
        raise ShopError(f"{items_path}: an item file is a JSON list of products")
    attributes = _read_json(attributes_path, "attribute") if attributes_path else {}
    if not isinstance(attributes, dict):
        raise ShopError(f"{attributes_path}: an attribute file is a JSON object by asin")
    for asin, attrs in attributes.items():  # an entry without attributes gets the dummy one
        if not isinstance(attrs, dict) or not isinstance(attrs.get("attributes") or [], list):
            raise ShopError(
                f"{attributes_path}: {asin}'s entry is not an object with an attribute list"
            )
    products, seen = [], set()
    for index, p in enumerate(items):
        missing = [k for k in _REQUIRED_ITEM if not isinstance(p, dict) or k not in p]
        if missing:
            raise ShopError(f"{items_path}: product {index} lacks {missing}")
        asin = str(p["asin"])
        if asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        pricing, tag = _pricing(p.get("pricing"), asin)
        bullets = p.get("small_description") or []
        attrs = attributes.get(asin, {})
        products.append(
            {
                "asin": asin,
                "name": str(p["name"]),
                "Title": str(p["name"]),
                "category": str(p["category"]),
                "query": str(p["query"]).lower().strip(),
                "product_category": str(p["product_category"]),
                "Description": str(p.get("full_description") or ""),
                "BulletPoints": [str(b) for b in bullets]
                if isinstance(bullets, list)
                else [str(bullets)],
                "pricing": pricing,
                "Price": tag,
                "price": pricing[0]
                if len(pricing) == 1
                else random.Random(f"price:{asin}").uniform(*pricing),
                "options": _options(p.get("customization_options")),
                "Attributes": list(attrs.get("attributes") or ["DUMMY_ATTR"])
                if isinstance(attrs, dict)
                else ["DUMMY_ATTR"],
                "Reviews": [],
                "Rating": "N.A.",
            }
        )
    if not products:
        raise ShopError(f"{items_path}: no products")
    return products


def search_text(product: dict[str, Any]) -> str:
    """The text the original's index holds for a product (lower case)."""
    option_text = ", and ".join(f"{k}: {', '.join(v)}" for k, v in product["options"].items())
    first = product["BulletPoints"][0] if product["BulletPoints"] else ""
    return " ".join([product["Title"], product["Description"], first, option_text]).lower()


def _tokenize(texts: list[str]) -> list[list[str]]:
    import bm25s

    return bm25s.tokenize(texts, stopwords="en", return_ids=False, show_progress=False)


class Shop:
    """The products by asin and a BM25 index over them."""

    def __init__(self, products: Sequence[dict[str, Any]]) -> None:
        import bm25s

        self.products = list(products)
        self.by_asin = {p["asin"]: p for p in self.products}
        self._bm25 = bm25s.BM25()
        self._bm25.index(_tokenize([search_text(p) for p in self.products]), show_progress=False)

    def product(self, asin: str) -> dict[str, Any]:
        """The product ``asin`` (any case); `ShopError` if the shop has none."""
        product = self.by_asin.get(asin) or self.by_asin.get(asin.upper())
        if product is None:
            raise ShopError(f"unknown product {asin!r}")
        return product

    def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[str]:
        """The asins of the top ``k`` products with a positive BM25 score, best first."""
        tokens = _tokenize([query.lower()])
        if not tokens[0]:
            return []
        k = min(k, len(self.products))
        result = self._bm25.retrieve(tokens, k=k, show_progress=False)
        return [
            self.products[int(i)]["asin"]
            for i, s in zip(result.documents[0], result.scores[0], strict=True)
            if float(s) > 0
        ]


_SHOPS: dict[tuple[Any, ...], Shop] = {}


def _identity(path: str | os.PathLike | None) -> tuple[Any, ...]:
    if path is None:
        return ()
    path = Path(path).resolve()
    stat = path.stat() if path.is_file() else None
    return (str(path), stat.st_size, stat.st_mtime_ns) if stat else (str(path),)


def load_shop(items_path: str | os.PathLike, attributes_path: str | os.PathLike | None) -> Shop:
    """The shop of these files, built once per process (again when a file changed)."""
    key = (_identity(items_path), _identity(attributes_path))
    if key not in _SHOPS:
        _SHOPS[key] = Shop(load_products(items_path, attributes_path))
    return _SHOPS[key]


# --------------------------------------------------------------------------- pages


@dataclass
class Session:
    """One shopper's browser: the page shown and what it remembers (the original's session:
    keywords, page, asin, options)."""

    shop: Shop
    page: str = "search"  # search | results | item | sub | done
    keywords: str = ""
    results: list[str] = field(default_factory=list)
    page_number: int = 1
    asin: str | None = None
    sub_page: str = ""
    options: dict[str, str] = field(default_factory=dict)

    # ------------------------------------------------------------------ what can be done

    def clickables(self) -> list[str]:
        """The lower-case names ``click[...]`` accepts on this page, in page order."""
        if self.page == "results":
            out = [BACK_TO_SEARCH] + ([PREV_PAGE] if self.page_number > 1 else []) + [NEXT_PAGE]
            return out + [a.lower() for a in self.shown()]
        if self.page == "item":
            product = self.product()
            values = [v for vs in product["options"].values() for v in vs]
            return [BACK_TO_SEARCH, PREV_PAGE, *dict.fromkeys(values), *SUB_PAGES, BUY_NOW]
        if self.page == "sub":
            return [BACK_TO_SEARCH, PREV_PAGE]
        return []

    def has_search_bar(self) -> bool:
        """Only the search page has one (the admissible list offers a search there)."""
        return self.page == "search"

    def shown(self) -> list[str]:
        """The asins on the current results page."""
        start = (self.page_number - 1) * PRODUCT_WINDOW
        return self.results[start : start + PRODUCT_WINDOW]

    def product(self) -> dict[str, Any]:
        """The product of the item page."""
        if self.asin is None:
            raise ShopError("no product is open")
        return self.shop.product(self.asin)

    # ------------------------------------------------------------------ actions

    def search(self, keywords: str) -> None:
        """Show page 1 of the results for ``keywords`` (from any page, as the original)."""
        self.keywords = keywords
        self.results = self.shop.search(keywords)
        self._show_results(1)

    def _show_results(self, page_number: int) -> None:
        self.page, self.page_number = "results", page_number
        self.asin, self.options = None, {}

    def click(self, name: str) -> bool:
        """Click the clickable ``name`` (lower case); True when the click buys."""
        if name == BUY_NOW:
            self.page = "done"
            return True
        if name == BACK_TO_SEARCH:
            self.page = "search"
        elif name == NEXT_PAGE and self.page == "results":
            self._show_results(self.page_number + 1)
        elif name == PREV_PAGE and self.page == "results":
            self._show_results(self.page_number - 1)
        elif name == PREV_PAGE and self.page == "sub":
            self.page = "item"
        elif name == PREV_PAGE and self.page == "item":
            self._show_results(self.page_number)
        elif name in SUB_PAGES:
            self.page, self.sub_page = "sub", name
        elif self.page == "results":  # a product link
            self.asin = self.shop.product(name)["asin"]
            self.page = "item"
        else:  # an option value of the item page
            for option_name, values in self.product()["options"].items():
                if name in values:
                    self.options[option_name] = name
            self.page = "item"
        return False

    # ------------------------------------------------------------------ rendering

    def render(self) -> str:
        """The page as the original's simple text mode shows it (visible texts joined by
        ``[SEP]``), without the instruction (the prompt states the task)."""
        if self.page == "search":
            return "WebShop [SEP] Search"
        if self.page == "results":
            parts = [
                "Back to Search",
                f"Page {self.page_number} (Total results: {len(self.results)})",
            ]
            parts += (["< Prev"] if self.page_number > 1 else []) + ["Next >"]
            for asin in self.shown():
                p = self.shop.product(asin)
                parts += [asin, p["Title"], p["Price"]]
            return SEP.join(parts)
        product = self.product()
        if self.page == "item":
            parts = ["Back to Search", "< Prev"]
            for option_name, values in product["options"].items():
                parts += [option_name, *values]
            parts += [
                product["Title"],
                f"Price: {product['Price']}",
                f"Rating: {product['Rating']}",
            ]
            parts += ["Description", "Features", "Reviews", "Buy Now"]
            return SEP.join(parts)
        if self.page == "sub":
            parts = ["Back to Search", "< Prev"]
            if self.sub_page == "description":
                parts.append(product["Description"] or "N.A.")
            elif self.sub_page == "features":
                parts += product["BulletPoints"] or ["N.A."]
            else:
                parts += [str(r.get("body", "")) for r in product["Reviews"]] or ["N.A."]
            return SEP.join(parts)
        return "Thank you for shopping with us!"
