"""The check at the end of a copy: row counts per table on both sides, and per session
a SHA-256 of its row, usage ledger and messages (plus one of its message ids), so a
difference names the sessions it is in."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass
from typing import Any
from collections.abc import Iterable

from sqlalchemy import Connection, select

from ..repositories.base import ID_CHUNK
from ..titles import split_title_number
from .plan import AFTER_SESSIONS, BEFORE_SESSIONS, COPIED_TABLES, TABLES, Progress, meta_key_copied
from .rows import M, P, S, U, CopyRows

def _canonical(values: Iterable[Any]) -> bytes:
    """Values by type and exact content, unambiguously: ``repr`` of the tuple (a float's
    repr round-trips its bits, text is quoted and escaped, ``1``, ``1.0`` and ``'1'``
    differ), with driver buffer types read as the bytes they hold."""
    return repr(tuple(bytes(v) if isinstance(v, (bytearray, memoryview)) else v for v in values)).encode(
        "utf-8", "surrogatepass")


def _feed(h: Any, values: Iterable[Any]) -> None:
    data = _canonical(values)
    h.update(len(data).to_bytes(8, "big") + data)


def _row_digest(values: Iterable[Any]) -> bytes:
    return hashlib.sha256(_canonical(values)).digest()


_MOD = 2**256


@dataclass
class _SessionSum:
    content: str
    ids: str
    title: Any

    def whole(self) -> int:
        return int.from_bytes(_row_digest([self.content, self.ids, self.title]), "big")


class Verifier(CopyRows):
    """Compares the source snapshot with the destination after the copy (see the module docstring)."""

    #: Where "verify" reports how far it got; set by the run (:class:`~.copier.Copier`).
    progress: Progress

    def verify(self) -> None:
        report = self.report
        src_sum = dst_sum = 0
        for name in COPIED_TABLES:
            if self.columns(name) is None:
                continue
            if name == "state_meta":
                keys = TABLES[name].c.key
                s = sum(1 for (k,) in self.src.execute(select(keys)) if meta_key_copied(k))
                d = sum(1 for (k,) in self.dst.execute(select(keys)) if meta_key_copied(k))
            else:
                s, d = self._count(self.src, name), self._count(self.dst, name)
            report.tables[name] = {"source": s, "destination": d}
        scols = self.columns("sessions")
        if scols is not None:
            total = self._count(self.src, "sessions", S.c.id.is_not(None))
            checked = 0
            for page in self._pages("sessions", scols, ID_CHUNK):
                s_rows = {r[scols.index("id")]: dict(zip(scols, r, strict=True)) for r in page}
                ids = list(s_rows)
                d_rows = {}
                for start in range(0, len(ids), ID_CHUNK):
                    chunk = ids[start:start + ID_CHUNK]
                    for r in self.dst.execute(select(*(S.c[c] for c in scols)).where(S.c.id.in_(chunk))):
                        d_rows[r[scols.index("id")]] = dict(zip(scols, r, strict=True))
                self._expected(s_rows)
                s_sums = self._digests(self.src, s_rows)
                d_sums = self._digests(self.dst, d_rows)
                for sid in ids:
                    a, b = s_sums[sid], d_sums.get(sid)
                    src_sum = (src_sum + a.whole()) % _MOD
                    if b is None:
                        report.mismatched_sessions.append(sid)
                        continue
                    dst_sum = (dst_sum + b.whole()) % _MOD
                    verdict = self._compare(a, b)
                    if verdict == "kept":
                        report.kept_sessions.append(sid)
                    elif verdict != "same":
                        report.mismatched_sessions.append(sid)
                checked += len(ids)
                self.progress("verify", checked, total)
            report.sessions_checked = checked
            if not self.merge:
                self._counts_match("sessions", report.not_copyable.get("sessions", 0))
                self._counts_match("messages", report.not_copyable.get("messages", 0))
                self._counts_match("session_model_usage", report.not_copyable.get("session_model_usage", 0))
        for name in (*BEFORE_SESSIONS, *AFTER_SESSIONS):
            self._verify_table(name)
        self.dst.rollback()
        report.source_checksum = f"{src_sum:064x}"
        report.destination_checksum = f"{dst_sum:064x}"
        report.verified = True

    def _counts_match(self, name: str, not_copyable: int) -> None:
        counts = self.report.tables.get(name)
        if counts and counts["destination"] != counts["source"] - not_copyable:
            self.report.mismatched_rows[name] = abs(counts["source"] - not_copyable - counts["destination"])

    def _expected(self, rows: dict[Any, dict[str, Any]]) -> None:
        """The source rows as the destination must hold them: links that cannot be stored dropped."""
        parents = {r.get("parent_session_id") for r in rows.values()} - {None}
        known = self._present(self.src, S.c.id, parents) | self._present(self.dst, S.c.id, parents)
        prompts = {r.get("system_prompt_hash") for r in rows.values()} - {None}
        stored = self._present(self.src, P.c.hash, prompts) | self._present(self.dst, P.c.hash, prompts)
        for r in rows.values():
            if r.get("parent_session_id") is not None and r["parent_session_id"] not in known:
                r["parent_session_id"] = None
            if r.get("system_prompt_hash") is not None and r["system_prompt_hash"] not in stored:
                r["system_prompt_hash"] = None

    def _digests(self, conn: Connection, rows: dict[Any, dict[str, Any]]) -> dict[Any, _SessionSum]:
        """Per session: content (row but title, usage ledger, messages but ids) and ids."""
        content = {sid: hashlib.sha256() for sid in rows}
        ids = {sid: hashlib.sha256() for sid in rows}
        for sid, row in rows.items():
            _feed(content[sid], (v for k, v in row.items() if k != "title"))
        keys = list(rows)
        mcols = self.columns("messages") or []
        if mcols:
            sid_at = mcols.index("session_id")
            plain = [i for i, c in enumerate(mcols) if c not in ("id", "display_order")]
            idents = [mcols.index(c) for c in ("id", "display_order") if c in mcols]
            for start in range(0, len(keys), ID_CHUNK):
                chunk = keys[start:start + ID_CHUNK]
                query = (select(*(M.c[c] for c in mcols)).where(M.c.session_id.in_(chunk))
                         .order_by(M.c.session_id, M.c.id))
                result = conn.execute(query, execution_options={"stream_results": True, "yield_per": 2000})
                try:
                    for r in result:
                        sid = r[sid_at]
                        _feed(content[sid], (r[i] for i in plain))
                        _feed(ids[sid], (r[i] for i in idents))
                finally:
                    result.close()
        if self.ucols:
            ledger: dict[Any, list[bytes]] = defaultdict(list)
            for start in range(0, len(keys), ID_CHUNK):
                chunk = keys[start:start + ID_CHUNK]
                for r in conn.execute(select(*(U.c[c] for c in self.ucols)).where(U.c.session_id.in_(chunk))):
                    ledger[r[self.ucols.index("session_id")]].append(_row_digest(r))
            for sid, digests in ledger.items():
                for d in sorted(digests):
                    content[sid].update(d)
        return {sid: _SessionSum(content[sid].hexdigest(), ids[sid].hexdigest(), rows[sid].get("title"))
                for sid in rows}

    def _compare(self, a: _SessionSum, b: _SessionSum) -> str:
        same_title = a.title == b.title or (
            self.merge and a.title is not None and b.title is not None
            and split_title_number(b.title)[0] == split_title_number(a.title)[0]
        )
        if a.content == b.content and same_title and (a.ids == b.ids or self.merge):
            return "same"
        return "kept" if self.merge else "differs"

    def _verify_table(self, name: str) -> None:
        """Every source row is in the destination, equal (outside a merge: and nothing more)."""
        cols = self.columns(name)
        if cols is None:
            return
        key = [c.name for c in TABLES[name].primary_key.columns]
        missing = differing = 0
        for page in self._pages(name, cols, ID_CHUNK):
            rows = [dict(zip(cols, r, strict=True)) for r in page]
            if name == "state_meta":
                rows = [r for r in rows if meta_key_copied(r["key"])]
            found = self._lookup(self.dst, name, cols, [tuple(r[k] for k in key) for r in rows])
            for row in rows:
                there = found.get(tuple(row[k] for k in key))
                if there is None:
                    missing += 1
                elif _row_digest(there.values()) != _row_digest(row.values()):
                    differing += 1
        counts = self.report.tables.get(name, {})
        expected = counts.get("source", 0) - self.report.not_copyable.get(name, 0)
        extra = 0 if self.merge else max(0, counts.get("destination", 0) - expected)
        if self.merge and differing:
            self.report.kept_rows[name] = differing
            differing = 0
        if missing or differing or extra:
            self.report.mismatched_rows[name] = missing + differing + extra

