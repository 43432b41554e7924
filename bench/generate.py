"""Deterministic generator of realistic Hermes ``state.db`` files for the benchmarks.

    python bench/generate.py 200k            # build (or reuse) bench/out/state-200000-s1-g<N>.db
    python bench/generate.py 1M --seed 7

The file is created with ``SessionDB(path)`` (so it is migrated to head exactly as a
user's file would be), then filled through plain ``sqlite3.executemany`` for speed.
The FTS triggers of the real schema index every row as it is inserted, so the word
and trigram indexes are built the same way a live database builds them.

What is in it (all drawn from one seeded ``random.Random``):

* sessions from cli / telegram / tui / discord, several models and billing routes,
  token/cost counters consistent with their messages, titles on about a third of the
  roots (unique, as the schema demands; compression continuations get "title #N");
* messages in conversation order: optional system prompt, user turns, assistant turns
  that call tools (``tool_calls`` JSON) followed by ``tool`` results (``tool_name``),
  final assistant answers with ``finish_reason``; some reasoning; a few recalled-memory
  blocks in user turns; English, Chinese, Japanese and Korean sessions; lengths drawn
  from clipped log-normal distributions (user 10–300, assistant 50–2000, tool
  100–4000 characters);
* timestamps that only ever increase with the message id (as in a live database);
* lineage: compression chains (parent ended 'compression', child started after that
  end), branches (parent ended 'branched'), delegate children (never shown in
  listings), one 1,000-deep compression chain for the lineage benchmark, one
  500-message session for the replay benchmark.

The database is cached under ``bench/out/`` keyed by size, seed and generator version;
a JSON sidecar records the ids the benchmarks need (deep chain root/tip, the
500-message session, counts).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

OUT = Path(__file__).resolve().parent / "out"

#: Bump when the generated content changes, so stale caches are not reused.
GEN_VERSION = 1

DEEP_CHAIN = 1000
REPLAY_MESSAGES = 500
#: Everything in the timeline starts here (2024-01-01 UTC); never time.time().
EPOCH = 1_704_067_200.0

SIZES = {"10k": 10_000, "200k": 200_000, "1m": 1_000_000}


def parse_size(text: str) -> int:
    t = text.strip().lower().replace("_", "")
    if t in SIZES:
        return SIZES[t]
    if t.endswith("k"):
        return int(float(t[:-1]) * 1_000)
    if t.endswith("m"):
        return int(float(t[:-1]) * 1_000_000)
    return int(t)


def label(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1_000 and n % 1_000 == 0:
        return f"{n // 1_000}k"
    return str(n)


# --------------------------------------------------------------------------- vocabulary

_EN_FUNCTION = (
    "the a to of and in is it for that this with on you be as we can not are if or from by at an will "
    "have should was but so then here there what how why when which now just also all any some more need "
    "use let me my our your i do does did it's don't can't one two first next after before into out up "
    "about than only very still again same other each like make sure check see run try get set add"
).split()

# Roughly in order of how often an engineer talks about them (Zipf rank = position).
_EN_TECH = (
    "file error function test code python config database session message server output command "
    "query table model data request response api user value type path class method index version "
    "change build issue result line update branch commit install script module import string list "
    "migration schema token context prompt tool call result docker container cache memory timeout "
    "connection retry log debug warning exception traceback stack thread process async await lock "
    "transaction sqlite postgres redis queue worker deploy release package dependency pytest fixture "
    "assert mock patch refactor rename performance latency benchmark throughput search indexer "
    "fts5 trigram bm25 snippet wal checkpoint vacuum pragma rollback savepoint upgrade downgrade "
    "alembic sqlalchemy orm engine pool dialect json yaml toml csv parquet pandas numpy dataframe "
    "react component state hook render props typescript javascript node npm webpack vite css html "
    "kubernetes helm pod cluster namespace ingress service secret env variable terraform aws s3 "
    "lambda gcp azure bucket region latency p95 p50 metric dashboard grafana prometheus alert "
    "incident oncall outage postmortem refused reset permission denied forbidden unauthorized "
    "oauth jwt auth login password hash bcrypt ssl tls certificate proxy nginx gateway webhook "
    "telegram discord slack bot channel chat reply thread mention embed attachment image vision "
    "audio transcript summary compress compression window truncate limit rate quota billing cost "
    "usage invoice provider openrouter anthropic openai gemini deepseek qwen llama mistral claude "
    "gpt reasoning effort temperature streaming chunk delta finish stop length regex parser lexer "
    "ast grammar tokenizer unicode utf8 encoding decode encode bytes buffer socket http https "
    "header cookie cors csrf xss injection sanitize escape quote backslash newline whitespace "
    "indent tab format lint black ruff mypy flake8 coverage ci pipeline github actions runner "
    "artifact cache hit miss eviction lru ttl shard replica primary failover backup restore "
    "snapshot cron schedule job retry backoff jitter convoy contention deadlock busy locked "
    "segfault panic oom killed exit status signal sigterm sigkill zombie daemon systemd journal"
).split()

_SYLLABLES = (
    "ka ri to mo ne su la vi de xo pra tel quin bor zan fel gri mon tas ver lok dri sen ule "
    "cor bax nim pol rek sta tru vox wen yal zer kol mir nas ost pex qua rul sib tov"
).split()

_TOOLS = (
    ("terminal", 30), ("read_file", 18), ("search_files", 12), ("write_file", 8), ("patch", 8),
    ("web_search", 7), ("web_extract", 4), ("execute_code", 5), ("browser_navigate", 2),
    ("todo", 2), ("memory", 2), ("delegate_task", 1), ("vision_analyze", 1),
)

_ZH_WORDS = (
    "数据 数据库 迁移 测试 索引 查询 性能 优化 错误 配置 文件 服务器 用户 会话 消息 模型 部署 容器 日志 问题 "
    "解决 方案 代码 函数 变量 我们 你 我 的 了 是 在 这个 一个 需要 可以 如果 然后 因为 所以 但是 已经 现在 "
    "运行 执行 结果 输出 输入 检查 修复 更新 版本 依赖 安装 构建 接口 请求 响应 超时 连接 失败 成功 内存 "
    "缓存 线程 进程 事务 锁 表 字段 压缩 上下文 搜索 全文 分词 中文 时间 记录 备份 恢复 看一下 帮我 "
    "为什么 怎么 还是 没有 应该 可能 问题是 这里 那个 一下 比较 大概 目前 之前 之后 另外 同时 注意 "
    "分析 处理 调用 返回 参数 类型 字符串 列表 字典 对象 方法 模块 导入 路径 目录 权限 环境 变量名"
).split()
_ZH_EN = "API SQLite Python Docker JSON HTTP WAL FTS5 Redis Git pytest Telegram".split()
_ZH_PUNCT = "，，，。。！？：、"

_JA_WORDS = (
    "データ データベース 移行 テスト 設定 ファイル サーバー エラー 確認 実行 結果 問題 修正 更新 "
    "インデックス 検索 性能 最適化 セッション メッセージ モデル ユーザー を は が に で と の です ます "
    "しました してください ありがとう こと これ それ 必要 可能 接続 失敗 成功 時間 日本語 全文 圧縮 "
    "ログ 原因 対応 調査 環境 変数 関数 引数 戻り値 処理 手順 方法 場合 今回 次に まず ちょっと "
    "お願いします 見て 教えて ください 大丈夫 確認しました 追加 削除 変更 保存 読み込み 書き込み"
).split()
_JA_PUNCT = "、、。。！？"

_KO_WORDS = (
    "데이터 데이터베이스 마이그레이션 테스트 설정 파일 서버 오류 확인 실행 결과 문제 수정 업데이트 "
    "인덱스 검색 성능 최적화 세션 메시지 모델 사용자 연결 실패 성공 시간 한국어 압축 로그 원인 "
    "환경 변수 함수 처리 방법 경우 이번 먼저 다음 추가 삭제 변경 저장 코드 배포 컨테이너 캐시 메모리"
).split()
_KO_PARTICLES = ("", "", "", "를", "을", "은", "는", "이", "가", "에", "에서", "으로", "와", "도")
_KO_ENDINGS = (
    "합니다.", "했습니다.", "해주세요.", "확인했습니다.", "있습니다.", "없습니다.", "될까요?", "감사합니다.",
    "하면 됩니다.", "필요합니다.",
)


def _zipf_weights(n: int, s: float = 1.05, q: float = 2.7) -> list[float]:
    return [1.0 / (i + q) ** s for i in range(n)]


class Corpus:
    """Large seeded text pools per language; messages are slices of them."""

    def __init__(self, rng: random.Random, en_chars: int = 6_000_000, cjk_chars: int = 1_500_000) -> None:
        self.rng = rng
        synth = []
        seen = set(_EN_FUNCTION) | set(_EN_TECH)
        while len(synth) < 4000:
            w = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4)))
            if w not in seen:
                seen.add(w)
                synth.append(w)
        self.idents = [f"{rng.choice(_EN_TECH)}_{rng.choice(_EN_TECH)}" for _ in range(600)]
        self.paths = [
            f"{rng.choice(('src', 'lib', 'app', 'tests', 'hermes_store', 'gateway'))}/"
            f"{rng.choice(_EN_TECH)}/{rng.choice(_EN_TECH)}.{rng.choice(('py', 'ts', 'json', 'md', 'yaml', 'sql'))}"
            for _ in range(400)
        ]
        vocab = _EN_FUNCTION + _EN_TECH + synth
        weights = [w * (6.0 if i < len(_EN_FUNCTION) else 1.0) for i, w in enumerate(_zipf_weights(len(vocab), 0.95))]
        self.en = self._english(vocab, weights, en_chars)
        self.zh = self._chinese(cjk_chars)
        self.ja = self._japanese(cjk_chars // 2)
        self.ko = self._korean(cjk_chars // 2)

    def _english(self, vocab: list[str], weights: list[float], n: int) -> str:
        rng = self.rng
        words = rng.choices(vocab, weights=weights, k=n // 5 + 1000)
        parts: list[str] = []
        i = total = 0
        while total < n:
            k = rng.randint(4, 18)
            sent = words[i:i + k]
            i += k
            if i + 20 > len(words):
                i = 0
            r = rng.random()
            if r < 0.10:
                sent.insert(rng.randrange(len(sent) + 1), f"`{rng.choice(self.idents)}()`")
            elif r < 0.16:
                sent.insert(rng.randrange(len(sent) + 1), rng.choice(self.paths))
            elif r < 0.20:
                sent.insert(rng.randrange(len(sent) + 1), str(rng.randint(0, 65535)))
            s = " ".join(sent)
            s = s[0].upper() + s[1:] + rng.choice("......?!:")
            r = rng.random()
            if r < 0.05:
                s = "\n\n" + s
            elif r < 0.09:
                s = "\n- " + s
            parts.append(s)
            total += len(s) + 1
        return " ".join(parts)

    def _chinese(self, n: int) -> str:
        rng = self.rng
        out: list[str] = []
        total = 0
        while total < n:
            k = rng.randint(4, 14)
            words = [rng.choice(_ZH_EN) if rng.random() < 0.06 else rng.choice(_ZH_WORDS) for _ in range(k)]
            s = "".join(words) + rng.choice(_ZH_PUNCT)
            out.append(s)
            total += len(s)
        return "".join(out)

    def _japanese(self, n: int) -> str:
        rng = self.rng
        out: list[str] = []
        total = 0
        while total < n:
            k = rng.randint(4, 14)
            words = [rng.choice(_ZH_EN) if rng.random() < 0.05 else rng.choice(_JA_WORDS) for _ in range(k)]
            s = "".join(words) + rng.choice(_JA_PUNCT)
            out.append(s)
            total += len(s)
        return "".join(out)

    def _korean(self, n: int) -> str:
        rng = self.rng
        out: list[str] = []
        total = 0
        while total < n:
            k = rng.randint(3, 9)
            words = [rng.choice(_KO_WORDS) + rng.choice(_KO_PARTICLES) for _ in range(k)]
            s = " ".join(words) + " " + rng.choice(_KO_ENDINGS)
            out.append(s)
            total += len(s) + 1
        return " ".join(out)

    def text(self, lang: str, length: int) -> str:
        """A slice of about ``length`` characters, cut at word boundaries where there are words."""
        pool = {"en": self.en, "zh": self.zh, "ja": self.ja, "ko": self.ko}[lang]
        start = self.rng.randrange(0, len(pool) - length - 64)
        if lang in ("en", "ko"):
            sp = pool.find(" ", start, start + 40)
            if sp >= 0:
                start = sp + 1
            chunk = pool[start:start + length]
            cut = chunk.rfind(" ")
            if cut > length // 2:
                chunk = chunk[:cut]
            return chunk.strip() or pool[start:start + length]
        return pool[start:start + length]


# --------------------------------------------------------------------------- sessions

_SOURCES = (("cli", 45), ("telegram", 25), ("tui", 18), ("discord", 12))
_MODELS = (
    ("anthropic/claude-sonnet-4", "openrouter", "https://openrouter.ai/api/v1", 3.0, 15.0, 30),
    ("openai/gpt-4o", "openai", "https://api.openai.com/v1", 2.5, 10.0, 20),
    ("google/gemini-2.5-pro", "openrouter", "https://openrouter.ai/api/v1", 1.25, 10.0, 15),
    ("deepseek/deepseek-chat", "deepseek", "https://api.deepseek.com/v1", 0.27, 1.1, 12),
    ("qwen/qwen3-coder", "openrouter", "https://openrouter.ai/api/v1", 0.2, 0.8, 10),
    ("anthropic/claude-opus-4", "anthropic", "https://api.anthropic.com", 15.0, 75.0, 8),
    ("hermes-4-70b", "nous", "https://inference-api.nousresearch.com/v1", 0.1, 0.4, 5),
)
_LANGS = (("en", 70), ("zh", 15), ("ja", 8), ("ko", 7))


def lang_mix(cjk_sessions: float | None = None) -> tuple[tuple[str, float], ...]:
    """The session language weights: :data:`_LANGS`, or with ``cjk_sessions`` percent of the
    sessions Chinese/Japanese/Korean (kept in their 15:8:7 proportion). The standard mix has
    30 % CJK sessions, which gives about 20 % CJK rows at 200k (15 % at 10k, where the
    English 1,000-deep chain and replay session are a quarter of the file)."""
    if cjk_sessions is None:
        return _LANGS
    cjk = [(lang, w) for lang, w in _LANGS if lang != "en"]
    total = sum(w for _l, w in cjk)
    share = min(max(float(cjk_sessions), 0.0), 100.0)
    return (("en", 100.0 - share), *((lang, share * w / total) for lang, w in cjk))


_END_REASONS = (("user_exit", 50), ("new_session", 20), ("timeout", 10), ("cli_close", 20))

SESSION_COLS = (
    "id", "source", "user_id", "model", "model_config", "system_prompt", "parent_session_id",
    "started_at", "ended_at", "end_reason", "message_count", "tool_call_count", "input_tokens",
    "output_tokens", "title", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens",
    "billing_provider", "billing_base_url", "billing_mode", "estimated_cost_usd", "cost_status",
    "cost_source", "pricing_version", "api_call_count", "cwd",
)
MESSAGE_COLS = (
    "session_id", "role", "content", "tool_call_id", "tool_calls", "tool_name", "timestamp",
    "token_count", "finish_reason", "reasoning",
)
USAGE_COLS = (
    "session_id", "model", "billing_provider", "billing_base_url", "billing_mode", "task",
    "api_call_count", "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
    "reasoning_tokens", "estimated_cost_usd", "actual_cost_usd", "cost_status", "cost_source",
    "first_seen", "last_seen",
)

_SYSTEM_PROMPT = (
    "You are Hermes, an AI agent created by Nous Research. You help the user with software, "
    "research and everyday tasks. Use the tools you have: run commands in the terminal, read and "
    "patch files, search the web. Be concise; show commands before running destructive ones."
)


def _weighted(rng: random.Random, table: tuple[tuple[Any, ...], ...]) -> tuple[Any, ...]:
    total = sum(r[-1] for r in table)
    x = rng.random() * total
    for row in table:
        x -= row[-1]
        if x <= 0:
            return row
    return table[-1]


def _lognormal_len(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return int(min(max(math.exp(rng.gauss(math.log(median), sigma)), lo), hi))


class Generator:
    """Builds one database; call :meth:`run`."""

    def __init__(self, path: Path, n_messages: int, seed: int, progress: Callable[[str], None] | None = None,
                 cjk_sessions: float | None = None) -> None:
        self.path = path
        #: Session languages: the standard mix, or ``cjk_sessions`` % of them Chinese/Japanese/Korean.
        self.langs = lang_mix(cjk_sessions)
        self.target = n_messages
        self.seed = seed
        self.rng = random.Random(seed)
        self.progress = progress or (lambda s: None)
        self.clock = EPOCH
        # Average gap between conversations so the whole file spans about a year.
        self.thread_gap = 365 * 86_400 / max(n_messages / 18, 1)
        self.msg_buf: list[tuple[Any, ...]] = []
        self.sess_buf: list[tuple[Any, ...]] = []
        self.usage_buf: list[tuple[Any, ...]] = []
        self.written = 0
        self.sessions = 0
        self.titles: set[str] = set()
        self.ids: set[str] = set()
        self.meta: dict[str, Any] = {}
        self.call_seq = 0
        self.conn: sqlite3.Connection | None = None

    # ---------------------------------------------------------------- helpers

    def _sid(self, ts: float) -> str:
        while True:
            sid = time.strftime("%Y%m%d_%H%M%S", time.gmtime(ts)) + f"_{self.rng.getrandbits(24):06x}"
            if sid not in self.ids:
                self.ids.add(sid)
                return sid

    def _title(self, lang: str) -> str:
        rng = self.rng
        if lang == "en" or rng.random() < 0.3:
            words = [w for w in self.corpus.text("en", 60).split() if w.isalpha()][: rng.randint(2, 6)] or ["Untitled"]
            base = " ".join(words).capitalize()
        else:
            base = self.corpus.text(lang, rng.randint(4, 12)).strip(" ，。、！？:.")
        base = base[:80] or "Untitled"
        title, n = base, 1
        while title in self.titles:
            n += 1
            title = f"{base} #{n}"
        self.titles.add(title)
        return title

    def _tick(self, lo: float, hi: float) -> float:
        self.clock += self.rng.uniform(lo, hi)
        return self.clock

    def _tool_call(self, lang: str) -> tuple[dict[str, Any], str]:
        rng = self.rng
        name = _weighted(rng, _TOOLS)[0]
        self.call_seq += 1
        cid = f"call_{self.seed:x}{self.call_seq:08x}"
        c = self.corpus
        if name == "terminal":
            args = {"command": rng.choice(("pytest -x ", "git diff ", "ls -la ", "docker compose logs ", "python -m ",
                                           "grep -rn ", "sqlite3 state.db ", "npm run ")) + rng.choice(c.paths)}
        elif name in ("read_file", "write_file", "patch"):
            args = {"path": rng.choice(c.paths)}
            if name != "read_file":
                args["content"] = c.text("en", rng.randint(40, 400))
        elif name in ("web_search", "search_files"):
            args = {"query": c.text(lang if rng.random() < 0.5 else "en", rng.randint(8, 60))}
        elif name == "execute_code":
            args = {"code": f"import {rng.choice(_EN_TECH)}\nprint({rng.choice(c.idents)}())"}
        else:
            args = {"input": c.text(lang, rng.randint(10, 120))}
        call = {"id": cid, "type": "function",
                "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}
        return call, name

    def _tool_result(self, name: str, lang: str) -> str:
        rng = self.rng
        n = _lognormal_len(rng, 700, 1.0, 100, 4000)
        body_lang = lang if (lang != "en" and rng.random() < 0.25) else "en"
        body = self.corpus.text(body_lang, n)
        if name == "terminal":
            return json.dumps({"output": body, "exit_code": rng.choice((0, 0, 0, 0, 1, 2)), "error": None},
                              ensure_ascii=False)
        if name == "read_file":
            lines = body.split(". ")
            return json.dumps({"content": "\n".join(f"{i + 1:>4}|{ln}" for i, ln in enumerate(lines)),
                               "total_lines": len(lines)}, ensure_ascii=False)
        if name == "web_search":
            results = [{"title": self.corpus.text("en", 40), "url": f"https://example.com/{i}",
                        "description": body[i * 200:(i + 1) * 200]} for i in range(max(1, n // 200))]
            return json.dumps({"results": results}, ensure_ascii=False)
        return json.dumps({"success": True, "result": body}, ensure_ascii=False)

    # ---------------------------------------------------------------- one session

    def _session(
        self,
        n_msgs: int,
        *,
        source: str,
        model_row: tuple[Any, ...],
        lang: str,
        parent: str | None = None,
        title: str | None = None,
        system: bool | None = None,
        end_reason: str | None = "auto",
        min_start: float | None = None,
        user_id: str | None = None,
    ) -> dict[str, Any]:
        """Write one session with ``n_msgs`` messages at the current clock; return its row facts."""
        rng = self.rng
        n_msgs = min(n_msgs, max(self.target - self.written, 0))  # land exactly on the target
        if min_start is not None and self.clock < min_start:
            self.clock = min_start
        started = self._tick(0.5, 30.0)
        sid = self._sid(started)
        model, provider, base_url, p_in, p_out, _w = model_row
        msgs: list[tuple[Any, ...]] = []
        tool_calls_total = 0
        api_calls = 0
        in_tok = out_tok = reasoning_tok = 0
        system = (rng.random() < 0.15) if system is None else system
        if system and n_msgs > 0:
            ts = self._tick(0.01, 0.2)
            text = _SYSTEM_PROMPT + "\n\n" + self.corpus.text("en", _lognormal_len(rng, 600, 0.6, 200, 2800))
            msgs.append((sid, "system", text, None, None, None, ts, len(text) // 4, None, None))
        pending_tools: list[tuple[str, str]] = []
        expect = "user"
        while len(msgs) < n_msgs:
            if pending_tools:
                cid, name = pending_tools.pop(0)
                ts = self._tick(0.3, 25.0)
                text = self._tool_result(name, lang)
                msgs.append((sid, "tool", text, cid, None, name, ts, len(text) // 4, None, None))
                if not pending_tools:
                    expect = "assistant"
                continue
            if expect == "user":
                ts = self._tick(5.0, 240.0)
                text = self.corpus.text(lang, _lognormal_len(rng, 70, 0.9, 10, 300))
                if rng.random() < 0.02:
                    text = ("<memory-context>\n[System note: recalled memory, not new user input]\n"
                            + self.corpus.text("en", 200) + "\n</memory-context>\n\n" + text)
                msgs.append((sid, "user", text, None, None, None, ts, len(text) // 4, None, None))
                in_tok += len(text) // 3
                expect = "assistant"
                continue
            # assistant turn: calls tools (then results follow) or answers
            ts = self._tick(1.0, 40.0)
            api_calls += 1
            remaining = n_msgs - len(msgs) - 1
            reasoning = None
            if ("claude" in model or "deepseek" in model) and rng.random() < 0.15:
                reasoning = self.corpus.text("en", _lognormal_len(rng, 300, 0.7, 60, 1500))
                reasoning_tok += len(reasoning) // 4
            if remaining >= 1 and rng.random() < 0.55:
                k = min(rng.choice((1, 1, 1, 2, 2, 3)), remaining)
                calls, names = [], []
                for _ in range(k):
                    call, name = self._tool_call(lang)
                    calls.append(call)
                    names.append((call["id"], name))
                text = None if rng.random() < 0.3 else self.corpus.text(lang, _lognormal_len(rng, 120, 0.7, 50, 500))
                tc = json.dumps(calls, ensure_ascii=False)
                tokens = len(text or "") // 4 + 20
                msgs.append((sid, "assistant", text, None, tc, None, ts, tokens, "tool_calls", reasoning))
                tool_calls_total += k
                pending_tools = names
                out_tok += len(tc) // 4
            else:
                text = self.corpus.text(lang, _lognormal_len(rng, 350, 0.9, 50, 2000))
                msgs.append((sid, "assistant", text, None, None, None, ts, len(text) // 4, "stop", reasoning))
                out_tok += len(text) // 3
                expect = "user"
            in_tok += 800 + 40 * len(msgs)  # the prompt grows with the conversation
        if end_reason == "auto":
            end_reason = None if rng.random() < 0.12 else _weighted(rng, _END_REASONS)[0]
        ended = self._tick(1.0, 120.0) if end_reason else None
        cache_read = int(in_tok * rng.uniform(0.0, 0.7)) if "claude" in model or "gpt" in model else 0
        cost = round((in_tok * p_in + out_tok * p_out) / 1e6, 6) if api_calls else None
        row = {
            "id": sid, "source": source, "user_id": user_id, "model": model,
            "model_config": json.dumps({"max_iterations": 90,
                                        "reasoning_effort": rng.choice(("low", "medium", "high"))}),
            "system_prompt": _SYSTEM_PROMPT if rng.random() < 0.5 else None,
            "parent_session_id": parent, "started_at": started, "ended_at": ended, "end_reason": end_reason,
            "message_count": len(msgs), "tool_call_count": tool_calls_total,
            "input_tokens": in_tok, "output_tokens": out_tok, "title": title,
            "cache_read_tokens": cache_read, "cache_write_tokens": int(cache_read * 0.1),
            "reasoning_tokens": reasoning_tok, "billing_provider": provider, "billing_base_url": base_url,
            "billing_mode": "chat_completions", "estimated_cost_usd": cost,
            "cost_status": "estimated" if cost is not None else None,
            "cost_source": "pricing_table" if cost is not None else None,
            "pricing_version": "2025-06" if cost is not None else None,
            "api_call_count": api_calls, "cwd": f"/home/user/{rng.choice(('hermes', 'webapp', 'infra', 'notes'))}",
        }
        self.sess_buf.append(tuple(row[c] for c in SESSION_COLS))
        if in_tok + out_tok + cache_read + reasoning_tok > 0:
            last = ended or (msgs[-1][6] if msgs else started)
            self.usage_buf.append((sid, model, provider, base_url, "chat_completions", "", api_calls, in_tok, out_tok,
                                   cache_read, int(cache_read * 0.1), reasoning_tok, cost or 0.0, 0.0,
                                   row["cost_status"], row["cost_source"], started, last))
        self.msg_buf.extend(msgs)
        self.written += len(msgs)
        self.sessions += 1
        if len(self.msg_buf) >= 20_000 and self.conn is not None:
            self.flush()
        return row

    # ---------------------------------------------------------------- threads

    def _draw_len(self) -> int:
        return _lognormal_len(self.rng, 7.0, 1.0, 1, 400)

    def _thread(self) -> None:
        """A root conversation, sometimes continued by compression, branched or delegating."""
        rng = self.rng
        self.clock += rng.expovariate(1.0 / self.thread_gap)
        source = _weighted(rng, _SOURCES)[0]
        model_row = _weighted(rng, _MODELS)
        lang = _weighted(rng, self.langs)[0]
        user_id = None if source in ("cli", "tui") else f"{source}:{rng.randint(1000, 1000 + 300)}"
        title = self._title(lang) if rng.random() < 0.33 else None
        r = rng.random()
        if r < 0.02 and source == "tui":  # a ghost: opened, never used
            self._session(0, source=source, model_row=model_row, lang=lang, title=None, user_id=user_id)
            return
        if r < 0.09:  # compression chain: root + 1..4 continuations
            n = rng.randint(1, 4)
            prev = self._session(self._draw_len() + 20, source=source, model_row=model_row, lang=lang, title=title,
                                 end_reason="compression", user_id=user_id)
            for i in range(n):
                last = i == n - 1
                t = f"{title} #{i + 2}" if title else None
                if t:
                    self.titles.add(t)
                prev = self._session(self._draw_len() + (0 if last else 20), source=source, model_row=model_row,
                                     lang=lang, parent=prev["id"], title=t, system=True,
                                     end_reason="auto" if last else "compression",
                                     min_start=prev["ended_at"], user_id=user_id)
            return
        root = self._session(self._draw_len(), source=source, model_row=model_row, lang=lang, title=title,
                             end_reason="branched" if r < 0.13 else ("auto" if r >= 0.16 else None), user_id=user_id)
        if r < 0.13:  # branch: shown in listings
            self._session(self._draw_len(), source=source, model_row=model_row, lang=lang, parent=root["id"],
                          min_start=root["ended_at"], user_id=user_id)
        elif r < 0.16:  # delegate: a sub-agent working for an open parent, hidden in listings
            for _ in range(rng.randint(1, 3)):
                self._session(_lognormal_len(rng, 6, 0.6, 2, 40), source=source, model_row=model_row, lang="en",
                              parent=root["id"], system=True, user_id=user_id)

    def _deep_chain(self) -> None:
        model_row, prev = _MODELS[0], None
        ids = []
        for i in range(DEEP_CHAIN):
            last = i == DEEP_CHAIN - 1
            row = self._session(2, source="cli", model_row=model_row, lang="en",
                                parent=prev["id"] if prev else None, system=False,
                                end_reason=None if last else "compression",
                                min_start=prev["ended_at"] if prev else None)
            ids.append(row["id"])
            prev = row
        self.meta["deep_chain_root"], self.meta["deep_chain_tip"] = ids[0], ids[-1]
        self.meta["deep_chain_length"] = len(ids)

    def _replay_session(self) -> None:
        self.clock += self.thread_gap
        row = self._session(REPLAY_MESSAGES, source="cli", model_row=_MODELS[0], lang="en", system=True)
        self.meta["replay_session"] = row["id"]
        self.meta["replay_messages"] = row["message_count"]

    # ---------------------------------------------------------------- database

    def flush(self) -> None:
        if not (self.sess_buf or self.msg_buf):
            return
        cur = self.conn.cursor()
        cur.execute("BEGIN")
        if self.sess_buf:
            cur.executemany(
                f"INSERT INTO sessions ({', '.join(SESSION_COLS)}) VALUES ({', '.join('?' * len(SESSION_COLS))})",
                self.sess_buf)
        if self.usage_buf:
            cur.executemany(
                f"INSERT INTO session_model_usage ({', '.join(USAGE_COLS)})"
                f" VALUES ({', '.join('?' * len(USAGE_COLS))})",
                self.usage_buf)
        if self.msg_buf:
            cur.executemany(
                f"INSERT INTO messages ({', '.join(MESSAGE_COLS)}) VALUES ({', '.join('?' * len(MESSAGE_COLS))})",
                self.msg_buf)
        cur.execute("COMMIT")
        self.sess_buf, self.msg_buf, self.usage_buf = [], [], []
        self.progress(f"  {self.written:>9,} / {self.target:,} messages, {self.sessions:,} sessions "
                      f"({time.perf_counter() - self.t0:.0f}s)")

    def run(self) -> dict[str, Any]:
        from hermes_store import SessionDB

        self.t0 = time.perf_counter()
        SessionDB(self.path).close()  # created and migrated to head the normal way
        self.corpus = Corpus(self.rng)
        self.conn = sqlite3.connect(self.path, isolation_level=None)
        self.conn.execute("PRAGMA synchronous=OFF")
        self.conn.execute("PRAGMA cache_size=-262144")  # 256 MiB while building
        special = DEEP_CHAIN * 2 + REPLAY_MESSAGES
        body = max(self.target - special, 0)
        chain_at, replay_at = body * 0.45, body * 0.7
        placed_chain = placed_replay = False
        while self.written < self.target:
            if not placed_chain and self.written >= chain_at:
                self._deep_chain()
                placed_chain = True
                continue
            if not placed_replay and self.written >= replay_at:
                self._replay_session()
                placed_replay = True
                continue
            self._thread()
        self.flush()
        self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        counts = self.conn.execute("SELECT (SELECT count(*) FROM messages), (SELECT count(*) FROM sessions)").fetchone()
        listed = self.conn.execute(
            "SELECT count(*) FROM sessions s LEFT JOIN sessions p ON p.id = s.parent_session_id WHERE "
            "s.parent_session_id IS NULL OR p.id IS NULL OR "
            "(p.end_reason = 'branched' AND p.ended_at IS NOT NULL AND s.started_at >= p.ended_at)").fetchone()[0]
        roles = dict(self.conn.execute("SELECT role, count(*) FROM messages GROUP BY role").fetchall())
        self.conn.close()
        self.meta.update(
            messages=counts[0], sessions=counts[1], listed_sessions=listed, roles=roles, seed=self.seed,
            target=self.target, gen_version=GEN_VERSION, build_seconds=round(time.perf_counter() - self.t0, 1),
            bytes=self.path.stat().st_size,
        )
        return self.meta


def sample_messages(n: int, seed: int = 99, sessions: int = 1) -> list[list[dict[str, Any]]]:
    """``sessions`` conversations of ``n`` realistic messages each, as dicts (for write benchmarks).

    Same distributions as the databases (roles, lengths, languages, tool calls), no
    database involved. Timestamps are left out: writers stamp them.
    """
    g = Generator(Path("unused"), n * sessions + 10, seed)
    g.corpus = Corpus(g.rng, en_chars=400_000, cjk_chars=150_000)
    out = []
    for _ in range(sessions):
        g.msg_buf = []
        g._session(n, source="cli", model_row=_MODELS[0], lang=_weighted(g.rng, _LANGS)[0], system=False)
        out.append([
            {k: v for k, v in zip(MESSAGE_COLS, row, strict=True)
             if k not in ("session_id", "timestamp") and v is not None}
            for row in g.msg_buf
        ])
    return out


def schema_head() -> str:
    """The library's newest migration: a cached file is only reused at the same schema."""
    try:
        from hermes_store import migrations

        return str(migrations.head())
    except Exception:
        return "unknown"


def db_path(n_messages: int, seed: int, cjk_sessions: float | None = None) -> Path:
    mix = "" if cjk_sessions is None else f"-cjk{cjk_sessions:g}"
    return OUT / f"state-{n_messages}-s{seed}{mix}-g{GEN_VERSION}-r{schema_head()}.db"


def finalize(path: Path, progress: Callable[[str], None]) -> dict[str, Any]:
    """Bring state the library maintains outside SQL triggers up to date, as on a live file.

    Rows inserted with plain sqlite3 bypass the library's write path. A file written by
    SessionDB all along would have every derived index current, so ask the library to
    catch up now (``SessionDB.index_search()`` when the library has it).
    """
    from hermes_store import SessionDB

    done: dict[str, Any] = {}
    t = time.perf_counter()
    db = SessionDB(path)
    try:
        done["open_seconds"] = round(time.perf_counter() - t, 1)
        for name in ("index_search",):
            fn = getattr(db, name, None)
            if callable(fn):
                t = time.perf_counter()
                progress(f"  finalize: SessionDB.{name}() ...")
                result = fn()
                done[name] = {"result": result if isinstance(result, (int, float, str, list)) else str(result),
                              "seconds": round(time.perf_counter() - t, 1)}
    finally:
        db.close()
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return done


def ensure_db(n_messages: int, seed: int = 1, progress: Callable[[str], None] | None = print,
              force: bool = False, cjk_sessions: float | None = None) -> tuple[Path, dict[str, Any]]:
    """The cached database for (size, seed[, CJK session share]), generating it first when missing."""
    OUT.mkdir(parents=True, exist_ok=True)
    path = db_path(n_messages, seed, cjk_sessions)
    meta_path = path.with_suffix(".json")
    if path.exists() and meta_path.exists() and not force:
        return path, json.loads(meta_path.read_text())
    tmp = path.with_name(path.name + ".building")
    for p in (tmp, Path(str(tmp) + "-wal"), Path(str(tmp) + "-shm")):
        if p.exists():
            p.unlink()
    (progress or (lambda s: None))(f"generating {label(n_messages)} messages (seed {seed}) -> {path.name}")
    meta = Generator(tmp, n_messages, seed, progress, cjk_sessions=cjk_sessions).run()
    if cjk_sessions is not None:
        meta["cjk_sessions_pct"] = cjk_sessions
    meta["finalize"] = finalize(tmp, progress or (lambda s: None))
    meta["schema_head"] = schema_head()
    meta["bytes"] = tmp.stat().st_size
    for suffix in ("-wal", "-shm"):
        side = Path(str(tmp) + suffix)
        if side.exists():
            side.unlink()
    os.replace(tmp, path)
    meta_path.write_text(json.dumps(meta, indent=2, ensure_ascii=False))
    return path, meta


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sizes", nargs="*", default=["10k"], help="message counts: 10k, 200k, 1M or a number")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--force", action="store_true", help="regenerate even when cached")
    ap.add_argument("--cjk-sessions", type=float, default=None, metavar="PCT",
                    help="percent of sessions in Chinese/Japanese/Korean (default: the standard mix, 30); "
                         "a separate cached file")
    args = ap.parse_args(argv)
    for s in args.sizes:
        path, meta = ensure_db(parse_size(s), args.seed, force=args.force, cjk_sessions=args.cjk_sessions)
        print(path)
        print(json.dumps(meta, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
