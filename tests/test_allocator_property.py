"""PagePool against a plain-list model of SGLang's PD allocator rule, on random histories."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from forensics.attribution import PagePool


class ListModel:
    """The allocator rule as docs/architecture.md states it, with Python lists, nothing clever."""

    def __init__(self, pages: int):
        self.free = list(range(1, pages + 1))
        self.release: list[int] = []
        self.held: dict[int, list[int]] = {}

    def alloc(self, key: int, n: int) -> list[int]:
        if n > len(self.free):
            self.free = sorted(self.free + self.release)
            self.release = []
        n = min(n, len(self.free))
        pages, self.free = self.free[:n], self.free[n:]
        self.held[key] = pages
        return pages

    def free_(self, key: int) -> None:
        self.release = sorted(set(self.held.pop(key, []))) + self.release


# Each step allocates 1..12 pages for a new key, or frees a live key chosen by index.
steps = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(1, 12)),
        st.tuples(st.just("free"), st.integers(0, 50)),
    ),
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(pool_pages=st.integers(8, 40), history=steps)
def test_page_pool_matches_the_list_model(pool_pages, history):
    pool, model = PagePool(pool_pages), ListModel(pool_pages)
    live: list[int] = []
    for key, (op, arg) in enumerate(history):
        if op == "alloc":
            got = pool.alloc(key, arg).tolist()
            assert got == model.alloc(key, arg)
            assert got == sorted(got)  # the free list is always ascending
            live.append(key)
        elif live:
            victim = live.pop(arg % len(live))
            pool.free(victim)
            model.free_(victim)
    held = [p for pages in pool.held.values() for p in pages.tolist()]
    assert len(held) == len(set(held))  # no page is held twice
