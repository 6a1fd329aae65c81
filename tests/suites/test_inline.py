"""task_suites.inline: input files shown as text, read with the library that wrote them."""

import pytest

from task_suites._common import Draft
from task_suites.inline import file_as_text, inline_workspace
from task_suites.jobbench import docx_bytes, png_bytes, sqlite_bytes, xlsx_bytes


def test_each_binary_kind_is_read_back_as_text():
    import random

    sheet = file_as_text("e.xlsx", xlsx_bytes("Expenses", ["Vendor", "Amount"], [["Globex", 12.5], ["Acme", 3]]))
    assert sheet.splitlines() == ["sheet Expenses:", "Vendor,Amount", "Globex,12.5", "Acme,3"]
    db = file_as_text("hr.db", sqlite_bytes("create table t (id integer, name text)", "t", [(1, "Ada"), (2, "Ken")]))
    assert db.splitlines() == ["table t:", "id,name", "1,Ada", "2,Ken"]
    doc = file_as_text("c.docx", docx_bytes("Agreement", ["The fee is $5,000.", "Delaware law."]))
    assert doc.splitlines() == ["Agreement", "The fee is $5,000.", "Delaware law."]
    png = file_as_text("p.png", png_bytes(random.Random(0), 24, 32, {"Author": "Gus Lind"}))
    assert "24 x 32 pixels" in png and "Author: Gus Lind" in png
    assert file_as_text("notes.txt", b"plain\n") == "plain\n" == file_as_text("notes.txt", "plain\n")


def test_an_unreadable_file_is_a_clear_error():
    with pytest.raises(ValueError, match="cannot show blob.bin as text"):
        file_as_text("blob.bin", b"\xff\xfe\x00")


def test_inline_workspace_quotes_every_file_and_empties_the_workspace():
    draft = Draft(
        key="k",
        instruction="What is in a.txt? Use the write tool.",
        workspace={"b.txt": "bee\n", "a.txt": "ay\n"},
        verifier=None,
        category="lookup",
        reference={"answer.txt": "ay\n"},
    )
    easy = inline_workspace(draft)
    assert easy.workspace == {} and easy.key != draft.key and easy.reference == draft.reference
    assert easy.instruction.index("ay") < easy.instruction.index("bee") < easy.instruction.index("What is in a.txt")
    assert easy.instruction.endswith(draft.instruction)
    with pytest.raises(TypeError, match="dict workspace"):
        inline_workspace(Draft("k", "i", lambda ws: None, None, "c", {}))
