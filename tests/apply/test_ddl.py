"""Column renames read from DDL text."""

import pytest

from cdcflow.apply.ddl import column_renames


@pytest.mark.parametrize(
    ("ddl", "renames"),
    [
        ("ALTER TABLE `shop`.`orders` RENAME COLUMN `note` TO `remark`", [("note", "remark")]),
        ('ALTER TABLE "public"."t" RENAME COLUMN "A b" TO "c"', [("A b", "c")]),
        ("alter table t rename column a to b", [("a", "b")]),
        ("ALTER TABLE t CHANGE COLUMN a b varchar(10) NOT NULL, CHANGE c c int", [("a", "b")]),
        ("ALTER TABLE t CHANGE a b INT, RENAME COLUMN x TO y", [("a", "b"), ("x", "y")]),
        ("ALTER TABLE [dbo].[t] RENAME COLUMN [old] TO [new]", [("old", "new")]),
        ("ALTER TABLE t ADD COLUMN note varchar(64)", []),
        ("ALTER TABLE t RENAME TO u", []),  # a table rename, not a column's
        ("DROP TABLE x", []),
        ("INSERT INTO t VALUES ('RENAME COLUMN a TO b')", []),
        (None, []),
    ],
)
def test_column_renames(ddl, renames):
    assert column_renames(ddl) == renames
