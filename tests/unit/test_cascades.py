"""Which tracked tables a parent's row event reaches through foreign-key actions."""

from __future__ import annotations

from dblog.core.events import TableId
from dblog.sources.mysql.cascades import CascadeGraph, ForeignKey

P, C, MID, G, E, OTHER = (TableId("d", n) for n in ("p", "c", "mid", "g", "e", "o"))


def fk(child: TableId, parent: TableId, on_delete: str = "RESTRICT",
       on_update: str = "RESTRICT", cols: tuple[str, ...] = ("id",)) -> ForeignKey:
    return ForeignKey(f"{child.table}_fk", child, parent, ("pid",), cols, on_delete, on_update)


GRAPH = CascadeGraph.build([
    fk(C, P, on_delete="CASCADE"),
    fk(MID, P, on_delete="CASCADE"), fk(G, MID, on_delete="SET NULL"),
    fk(E, E, on_delete="SET NULL"),
    fk(OTHER, P, on_update="CASCADE", cols=("code",)),
    fk(C, OTHER),  # RESTRICT both ways: changes nothing
], tracked=[C, G, E])


def test_the_reader_watches_the_parents_whose_actions_reach_a_tracked_table() -> None:
    # OTHER is no tracked table and reaches none: P is watched for C and MID -> G only.
    assert GRAPH.parents == {P, MID, E}


def test_deletes_reach_through_untracked_tables_and_a_table_that_references_itself() -> None:
    assert GRAPH.affected(P, "d", [{"id": 1}]) == {C, G}
    assert GRAPH.affected(MID, "d", [{"id": 1}]) == {G}
    assert GRAPH.affected(E, "d", [{"id": 1}]) == {E}


def test_inserts_never_cascade_and_updates_only_when_a_referenced_column_changes() -> None:
    assert GRAPH.affected(P, "w", [{"id": 1}]) == frozenset()
    graph = CascadeGraph.build([fk(C, P, on_update="CASCADE", cols=("code",))], [C])
    same, moved = ({"id": 1, "code": "a"}, {"id": 2, "code": "a"}), ({"code": "a"}, {"code": "b"})
    assert graph.affected(P, "u", [same]) == frozenset()
    assert graph.affected(P, "u", [same, moved]) == {C}
    assert graph.affected(P, "u", [({"id": 1}, {"id": 1})]) == {C}  # code not in the image
    assert graph.affected(P, "d", [{"code": "a"}]) == frozenset()  # ON DELETE RESTRICT


def test_set_default_and_restrict_change_no_rows() -> None:
    graph = CascadeGraph.build([fk(C, P, on_delete="SET DEFAULT", on_update="NO ACTION")], [C])
    assert graph.parents == frozenset() and graph.affected(P, "d", [{"id": 1}]) == frozenset()
