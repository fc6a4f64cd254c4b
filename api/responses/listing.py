"""What the Responses and Conversations routes share: OpenAI's cursor pages over a list of
items (the query that asks for one, the list body) and the 404 of an id that names nothing of the
tenant's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import Depends, Query

from api.errors import ApiError

MAX_PAGE = 100


@dataclass(frozen=True, slots=True)
class PageQuery:
    """A list request's cursor: the items after the one named `after`, `limit` of them, in `order`."""

    after: str | None
    limit: int
    order: Literal["asc", "desc"]


def _page_query(
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 20,
    order: Literal["asc", "desc"] = "desc",
) -> PageQuery:
    return PageQuery(after, limit, order)


Paging = Annotated[PageQuery, Depends(_page_query)]  # a list route's query parameters


def not_found(kind: Literal["Response", "Conversation"], ident: str) -> ApiError:
    name = kind.lower()
    return ApiError(
        404, f"{kind} with id {ident!r} not found.", "not_found_error", f"{name}_id", f"{name}_not_found"
    )


def list_body(data: list[dict[str, Any]], has_more: bool = False) -> dict[str, Any]:
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


def page(items: list[dict[str, Any]], query: PageQuery) -> dict[str, Any]:
    """One page of `items` as `query` asks for it."""
    ordered = items if query.order == "asc" else items[::-1]
    if query.after is not None:
        at = next((i for i, item in enumerate(ordered) if item["id"] == query.after), None)
        if at is None:
            raise ApiError(400, f"no item {query.after!r} in this list", param="after")
        ordered = ordered[at + 1 :]
    return list_body(ordered[: query.limit], len(ordered) > query.limit)
