"""What the user is told: counts with the right singular or plural, skips counted by reason."""

from __future__ import annotations

from packer.wording import describe_skips, noun, plural, skip_reasons


def test_plural_and_noun():
    assert [plural(n, "sample") for n in (0, 1, 2)] == ["0 samples", "1 sample", "2 samples"]
    assert [plural(n, "class") for n in (1, 3)] == ["1 class", "3 classes"]
    assert [plural(n, "entry") for n in (1, 2)] == ["1 entry", "2 entries"]
    assert plural(2, "day") == "2 days" and plural(2, "GPU") == "2 GPUs" and plural(2, "box") == "2 boxes"
    assert [noun(n, "its") for n in (1, 2)] == ["its", "their"] and noun(2, "is") == "are"


def test_skips_are_counted_by_reason_with_their_first_files():
    skips = [("a.jpg", "cannot read: No such file or directory"), ("b.jpg", "empty file (0 bytes)"),
             ("c.jpg", "cannot read: No such file or directory"), ("d.jpg", "cannot read: No such file or directory"),
             ("e.jpg", "cannot read: No such file or directory")]
    assert skip_reasons(skips) == [("cannot read: No such file or directory", 4, ["a.jpg", "c.jpg", "d.jpg"], False),
                                   ("empty file (0 bytes)", 1, ["b.jpg"], False)]
    assert describe_skips(skips) == ('4 for "cannot read: No such file or directory" (a.jpg, c.jpg, d.jpg, ...); '
                                     '1 for "empty file (0 bytes)" (b.jpg)')
    assert describe_skips(skips, examples=0) == ('4 for "cannot read: No such file or directory"; '
                                                 '1 for "empty file (0 bytes)"')


def test_reasons_that_differ_only_in_numbers_count_as_one():
    skips = [("x.jpg", "8000x6000 = 48000000 pixels is above the limit of 1000"),
             ("y.jpg", "9000x6000 = 54000000 pixels is above the limit of 1000"),
             ("z.jpg", "1 = 1")]
    assert skip_reasons(skips, 1) == [("8000x6000 = 48000000 pixels is above the limit of 1000", 2, ["x.jpg"], True),
                                      ("1 = 1", 1, ["z.jpg"], False)]
    many = [(f"{i}.jpg", f"reason {chr(97 + i)}") for i in range(8)]
    assert describe_skips(many, reasons=2, examples=1) == ('1 for "reason a" (0.jpg); 1 for "reason b" (1.jpg); '
                                                         '6 for 6 other reasons')


def test_a_group_of_skips_is_shown_by_its_first_reason_as_it_was():
    """Numbers inside paths and sizes are never rewritten: the group's first reason is shown whole."""
    skips = [(f"adversary{i}/img.png", f"mask file /data/adversary{i}/m{i}.png: mask is {10 + i}x{9 + i} but the "
              f"image is 10x10") for i in (1, 2, 3)]
    skips += [("b/x.jpg", "mask file /data/b/m.png: mask is 4x4 but the image is 10x10"),
              ("c.jpg", "empty file (0 bytes)"), ("d.jpg", "empty file (0 bytes)")]
    groups = skip_reasons(skips, examples=2)
    assert [(g.reason, g.count, g.paths, g.varied) for g in groups] == [
        ("mask file /data/adversary1/m1.png: mask is 11x10 but the image is 10x10", 4,
         ["adversary1/img.png", "adversary2/img.png"], True),
        ("empty file (0 bytes)", 2, ["c.jpg", "d.jpg"], False)]
    line = describe_skips(skips, examples=0)
    assert line == ('4 for reasons like "mask file /data/adversary1/m1.png: mask is 11x10 but the image is 10x10"; '
                    '2 for "empty file (0 bytes)"')
    assert "N" not in line.replace("No", "")
