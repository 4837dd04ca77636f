"""`count_char(s STRING, c STRING) -> INT`: how many times the character `c` occurs in `s`, the
user-defined function of Nexmark q14: `plugins/count_char` in Python (world `scalar-function`).

Declared in the pipeline file with `[[function]]` (`name = "count_char"`, `arguments =
["STRING", "STRING"]`, `returns = "INT"`) and called from SQL, `count_char(url, '/')`, once per
batch with both arguments as columns (the constant `'/'` as a column of one repeated value).

As in Rust: characters are Unicode scalar values, only the first character of `c` counts, an
empty `c` occurs nowhere (0), and a NULL in either argument gives NULL. No `config`; `open`
refuses any declared function other than `count_char(STRING, STRING) -> INT`, naming it.
"""

from __future__ import annotations

import weir_plugin as weir
from wit_world import exports
from wit_world.exports import scalar
from wit_world.imports import types

NAME = "count_char"
_ARGUMENTS = [types.DataType_Utf8, types.DataType_Utf8]
_RETURNS = types.DataType_Int32


def _check(signature: scalar.Signature) -> None:
    """Refuses a declaration other than `count_char(utf8, utf8) -> int32`, naming it."""
    if signature.name != NAME:
        raise weir.invalid_config(
            f"function `{signature.name}`: this plugin has no function of that name "
            f"(it implements `{NAME}`)"
        )
    arguments = [type(t) for t in signature.arguments]
    if arguments != _ARGUMENTS or type(signature.returns) is not _RETURNS:
        raise weir.invalid_config(
            f"function `{NAME}` is declared as {weir.signature_text(signature)}, the plugin "
            f"implements {NAME}(utf8, utf8) -> int32"
        )


def count_char(s: types.Column, c: types.Column, rows: int) -> list[int | None]:
    """One count per row, `None` where either argument is null."""
    haystacks = weir.Strings(s.values.value)
    chars = weir.Strings(c.values.value)
    s_valid, c_valid = s.validity, c.validity
    needles: dict[bytes, bytes] = {}  # `c` as given -> its first character's UTF-8 bytes
    counts: list[int | None] = []
    for i in range(rows):
        if not (weir.is_valid(s_valid, i) and weir.is_valid(c_valid, i)):
            counts.append(None)
            continue
        given = chars[i]
        needle = needles.get(given)
        if needle is None:
            text = given.decode()
            needle = text[0].encode() if text else b""
            needles[given] = needle
        # UTF-8 never starts a character inside another one, so counting the character's bytes
        # counts the character. (`bytes.count(b"")` is not 0: an empty `c` is handled here.)
        counts.append(haystacks[i].count(needle) if needle else 0)
    return counts


class Scalar(exports.Scalar):
    def open(self, config: str, functions: list[scalar.Signature]) -> None:
        weir.parse_config(config or "{}", required=[])
        for signature in functions:
            _check(signature)

    def call(self, name: str, info: types.BatchInfo, args: types.Batch) -> types.Column:
        if name != NAME:
            raise weir.fatal(f"count_char: called as `{name}`, a function this plugin does not implement")
        schema = args.schema()
        if len(schema) != 2:
            raise weir.invalid_input(f"count_char takes 2 arguments, the call has {len(schema)}")
        for i, field in enumerate(schema):
            if type(field.data_type) is not types.DataType_Utf8:
                raise weir.invalid_input(
                    f"count_char: argument {i + 1} is {weir.type_name(field.data_type)}, not utf8"
                )
        rows = args.num_rows()
        return weir.int32_column(count_char(args.column(0), args.column(1), rows), NAME)
