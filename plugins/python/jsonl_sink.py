"""A foreachBatch sink appending rows to a JSON-lines file, exactly once per batch id:
`plugins/jsonl_sink` in Python, with the same file format and the same protocol, so either
plugin can take over the other's files.

Config: `{ "path": "/out/orders.jsonl" }`, inside a directory the pipeline grants
(`capabilities = { dirs = [ { host = "out", guest = "/out", writable = true } ] }`).

Protocol: a sidecar `<path>.batches` holds `"<last batch id> <data length>\\n"`. `write_batch(N)`
skips N if N <= last; otherwise truncates the data file to the recorded length (dropping what an
interrupted attempt appended), appends the rows, syncs, and replaces the sidecar atomically
(write `<path>.batches.tmp`, sync, rename). A replayed batch is therefore never written twice.

Rows: one object per row, keys in schema order, nulls omitted; timestamps RFC 3339 UTC with `Z`
(3 or 6 fractional digits when needed), dates `YYYY-MM-DD`, decimals exact at their scale.
"""

from __future__ import annotations

import datetime
import json
import os

import weir_plugin as weir
from wit_world import exports
from wit_world.imports import host, types

_EPOCH = datetime.datetime(1970, 1, 1)


def _io_error(what: str, path: str, e: OSError):
    message = f"jsonl_sink: {what} {path}: {e.strerror or e}"
    if isinstance(e, (FileNotFoundError, PermissionError)):
        return weir.fatal(message)
    return weir.retryable(message)


def _timestamp(micros: int) -> str:
    moment = _EPOCH + datetime.timedelta(microseconds=micros)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    frac = micros % 1_000_000
    if frac == 0:
        return f'"{text}Z"'
    if frac % 1000 == 0:
        return f'"{text}.{frac // 1000:03d}Z"'
    return f'"{text}.{frac:06d}Z"'


def _date(days: int) -> str:
    return f'"{(_EPOCH + datetime.timedelta(days=days)).date().isoformat()}"'


def _decimal(unscaled: int, scale: int) -> str:
    if scale <= 0:
        return str(unscaled * 10**-scale)
    sign = "-" if unscaled < 0 else ""
    digits = str(abs(unscaled)).rjust(scale + 1, "0")
    return f"{sign}{digits[:-scale]}.{digits[-scale:]}"


def _float(x: float) -> str:
    if x != x:
        return '"NaN"'
    if x in (float("inf"), float("-inf")):
        return '"Infinity"' if x > 0 else '"-Infinity"'
    return repr(x)


def _json_values(col: types.Column) -> list[str]:
    """Every value of the column as JSON text (a null's entry is never read)."""
    values, kind = col.values, weir.type_name(col.data_type)
    if kind == "utf8":
        return [json.dumps(s.decode(), ensure_ascii=False) for s in weir.Strings(values.value)]
    if kind in ("int32", "int64"):
        return [str(v) for v in values.value]
    if kind == "float64":
        return [_float(v) for v in values.value]
    if kind == "decimal128":
        scale = col.data_type.value.scale
        return [_decimal(v, scale) for v in weir.decimals(values.value)]
    if kind == "timestamp":
        return [_timestamp(v) for v in values.value]
    if kind == "date32":
        return [_date(v) for v in values.value]
    bits = int.from_bytes(values.value, "little")
    return ["true" if bits >> i & 1 else "false" for i in range(len(values.value) * 8)]


class JsonlSink:
    """The sink for one data file and its sidecar."""

    def __init__(self, config: str) -> None:
        cfg = weir.parse_config(config, required=["path"])
        path = cfg["path"]
        if not isinstance(path, str) or not os.path.basename(path):
            raise weir.invalid_config(f"jsonl_sink: path `{path}` does not name a file")
        folder = os.path.dirname(path) or "."
        try:
            os.stat(folder)
        except OSError as e:
            raise weir.invalid_config(
                f"jsonl_sink: directory {folder} of path `{path}` is not accessible (is it granted?): {e.strerror}"
            ) from None
        self.path = path
        self.sidecar = path + ".batches"

    def write_batch(self, info: types.BatchInfo, input: types.Batch) -> None:
        batch_id = info.batch_id
        last, length = self._read_progress()
        if last is not None and batch_id <= last:
            weir.log(f"jsonl_sink: batch {batch_id} is already in {self.path} (last written: {last}), skipping")
            return
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise _io_error("cannot open", self.path, e) from None
        with os.fdopen(fd, "r+b") as file:
            actual = os.fstat(fd).st_size
            if actual < length:
                raise weir.fatal(
                    f"jsonl_sink: {self.path} has {actual} bytes but {self.sidecar} records {length}: "
                    "the file was changed outside the sink"
                )
            if actual > length:
                weir.log(
                    f"jsonl_sink: dropping {actual - length} bytes of an interrupted write from {self.path}",
                    host.LogLevel.WARN,
                )
                file.truncate(length)
            file.seek(length)
            try:
                file.write(self._lines(input))
                file.flush()
                os.fsync(fd)
            except OSError as e:
                raise _io_error("cannot write", self.path, e) from None
            new_length = file.tell()
        self._write_progress(batch_id, new_length)

    def _lines(self, batch: types.Batch) -> bytes:
        rows = batch.num_rows()
        columns = [batch.column(i) for i in range(len(batch.schema()))]
        keys = [json.dumps(c.name, ensure_ascii=False) + ":" for c in columns]
        texts = [_json_values(c) for c in columns]
        valid = [c.validity for c in columns]
        out = []
        for row in range(rows):
            cells = [
                key + text[row]
                for key, text, validity in zip(keys, texts, valid)
                if weir.is_valid(validity, row)
            ]
            out.append("{" + ",".join(cells) + "}\n")
        return "".join(out).encode()

    def _read_progress(self) -> tuple[int | None, int]:
        try:
            with open(self.sidecar, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            return None, 0
        except OSError as e:
            raise _io_error("cannot read", self.sidecar, e) from None
        try:
            last, length = text.split()
            return int(last), int(length)
        except ValueError:
            raise weir.fatal(f"jsonl_sink: {self.sidecar} is not `<batch id> <length>`: {text!r}") from None

    def _write_progress(self, batch_id: int, length: int) -> None:
        tmp = self.sidecar + ".tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(f"{batch_id} {length}\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.sidecar)
        except OSError as e:
            raise _io_error("cannot write", tmp, e) from None


# componentize-py makes a new `Writer` for every call, so the opened sink lives here.
_sink: JsonlSink | None = None


class Writer(exports.Writer):
    def open(self, config: str, input_schema: list[types.Field]) -> None:
        global _sink
        _sink = JsonlSink(config)

    def write_batch(self, info: types.BatchInfo, input: types.Batch) -> None:
        if _sink is None:
            raise weir.fatal("jsonl_sink: write_batch before open")
        _sink.write_batch(info, input)
