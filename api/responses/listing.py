"""What the Responses and Conversations routes share: OpenAI's cursor pages over a list of
items, and the 404 of an id that names nothing of the tenant's."""

from __future__ import annotations

from typing import Any, Literal

from api.errors import ApiError

MAX_PAGE = 100


def not_found(kind: Literal["Response", "Conversation"], ident: str) -> ApiError:
    name = kind.lower()
    return ApiError(
        404, f"{kind} with id {ident!r} not found.", "not_found_error", f"{name}_id", f"{name}_not_found"
    )


def page(
    items: list[dict[str, Any]], after: str | None, limit: int, order: Literal["asc", "desc"]
) -> dict[str, Any]:
    """One page: the items after the one named `after`, in `order`."""
    ordered = items if order == "asc" else items[::-1]
    if after is not None:
        at = next((i for i, item in enumerate(ordered) if item["id"] == after), None)
        if at is None:
            raise ApiError(400, f"no item {after!r} in this list", param="after")
        ordered = ordered[at + 1 :]
    data = ordered[:limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(ordered) > limit,
    }
