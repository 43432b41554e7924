"""PostgreSQL words split and fold as SQLite's FTS5 ``unicode61`` tokenizer does.

Why this revision exists: hs0002 indexed words with ``to_tsvector('simple', …)``, whose
parser keeps compounds whole (``user@example.com``, ``foo.example.com``, ``main.py``,
``1.2.3`` are one token each) and does not fold accents, while FTS5's ``unicode61``
(Hermes' word index, ``remove_diacritics 1``) splits at every character that is not a
letter, digit or private-use character and folds ``café`` to ``cafe``. So ``example``
found ``user@example.com`` on SQLite only, and ``cafe`` found ``café`` on SQLite only.
hs0002's vector also let a phrase run from the end of ``content`` into ``tool_name``,
which FTS5 never does.

What it does, on PostgreSQL only (nothing on SQLite, whose FTS5 index is Hermes'):

* ``hermes_store_search_words(text)``: the text as unicode61 sees it, words joined by
  one space. Lower case (through the ICU root collation when the server has one, so the
  database's own locale, ``C`` included, does not matter), a Latin letter with one
  diacritic loses it (``é`` → ``e``; ``ế``, with two, stays, as in FTS5), the combining
  marks FTS5 drops are dropped, and every character FTS5 treats as a separator becomes
  a space. The separator set is written out below as code point ranges (measured from
  FTS5 itself for every code point) instead of ``[[:alnum:]]``, whose meaning depends
  on the locale. U+E000/U+E001, the private-use characters hermes_store stores NUL as
  on PostgreSQL, are separators too, so ``a<NUL>b`` still holds two words.
* ``hermes_store_search_vector(text)``: those words as a ``tsvector`` with their
  positions, built from the words themselves (not by the text search parser, whose idea
  of a letter depends on the locale too). A word longer than 2046 bytes, which a
  ``tsvector`` cannot hold, is left out but keeps its position.
* ``messages.search_vector`` is rebuilt from one such vector per column (content, tool
  name, tool calls, cut as before). Each column's words start one position late, so no
  phrase spans two columns. The query side folds its terms with the same function and
  casts its tsquery text (see :mod:`hermes_store.search.postgresql`).
* ``hermes_store_cjk_bigram_mark_dirty()`` reads the bigram high-water mark without a
  failing cast: under hs0002 a ``state_meta`` value that is not a number (it is
  writable through ``set_meta``) made every message insert fail. Such a value now
  means -1, as :func:`hermes_store.search.bigram.high_water` reads it.

A database whose encoding is not UTF8 gets a plainer ``hermes_store_search_words``
(lower case, runs of ``[[:alnum:]]``), since Unicode normalization needs UTF8. Rebuilding
the column rewrites ``messages`` once; afterwards a row's vector costs about twice what
hs0002's did (the folding is SQL, not the C parser), which is the price of the parity. The new functions are not in the models and
autogenerate does not compare functions; the column and index keep hs0002's names, which
env.py already hides.

Downgrade restores hs0002's column, index and trigger function exactly and drops the
two functions.

Revision ID: hs0003
Revises: hs0002
"""

from __future__ import annotations

from alembic import op

revision = "hs0003"
down_revision = "hs0002"
branch_labels = None
depends_on = None

#: Characters FTS5 unicode61 (SQLite 3.40) splits words at, as regex ranges from U+0001:
#: every character it keeps out of tokens, less the combining marks below (it drops
#: those instead), plus U+E000/U+E001 (NUL on PostgreSQL, see above).
SEPARATORS = (
    r"\u0001-\u002f\u003a-\u0040\u005b-\u0060\u007b-\u00a9\u00ab-\u00b1\u00b4\u00b6-\u00b8"
    r"\u00bb\u00bf\u00d7\u00f7\u02c2-\u02c5\u02d2-\u02df\u02e5-\u02eb\u02ed\u02ef-\u02ff\u0305"
    r"\u030d\u030e\u0310\u0312-\u031a\u031c-\u0322\u0329-\u032c\u032f\u0332-\u036f\u0375\u037e"
    r"\u0384\u0385\u0387\u03f6\u0482-\u0489\u055a-\u055f\u0589\u058a\u058f\u0591-\u05c7\u05f3"
    r"\u05f4\u0600-\u0604\u0606-\u061b\u061e\u061f\u064b-\u065f\u066a-\u066d\u0670\u06d4"
    r"\u06d6-\u06e4\u06e7-\u06ed\u06fd\u06fe\u0700-\u070d\u070f\u0711\u0730-\u074a"
    r"\u07a6-\u07b0\u07eb-\u07f3\u07f6-\u07f9\u0816-\u0819\u081b-\u0823\u0825-\u0827"
    r"\u0829-\u082d\u0830-\u083e\u0859-\u085b\u085e\u08e4-\u08fe\u0900-\u0903\u093a-\u093c"
    r"\u093e-\u094f\u0951-\u0957\u0962-\u0965\u0970\u0981-\u0983\u09bc\u09be-\u09c4\u09c7"
    r"\u09c8\u09cb-\u09cd\u09d7\u09e2\u09e3\u09f2\u09f3\u09fa\u09fb\u0a01-\u0a03\u0a3c"
    r"\u0a3e-\u0a42\u0a47\u0a48\u0a4b-\u0a4d\u0a51\u0a70\u0a71\u0a75\u0a81-\u0a83\u0abc"
    r"\u0abe-\u0ac5\u0ac7-\u0ac9\u0acb-\u0acd\u0ae2\u0ae3\u0af0\u0af1\u0b01-\u0b03\u0b3c"
    r"\u0b3e-\u0b44\u0b47\u0b48\u0b4b-\u0b4d\u0b56\u0b57\u0b62\u0b63\u0b70\u0b82\u0bbe-\u0bc2"
    r"\u0bc6-\u0bc8\u0bca-\u0bcd\u0bd7\u0bf3-\u0bfa\u0c01-\u0c03\u0c3e-\u0c44\u0c46-\u0c48"
    r"\u0c4a-\u0c4d\u0c55\u0c56\u0c62\u0c63\u0c7f\u0c82\u0c83\u0cbc\u0cbe-\u0cc4\u0cc6-\u0cc8"
    r"\u0cca-\u0ccd\u0cd5\u0cd6\u0ce2\u0ce3\u0d02\u0d03\u0d3e-\u0d44\u0d46-\u0d48\u0d4a-\u0d4d"
    r"\u0d57\u0d62\u0d63\u0d79\u0d82\u0d83\u0dca\u0dcf-\u0dd4\u0dd6\u0dd8-\u0ddf\u0df2-\u0df4"
    r"\u0e31\u0e34-\u0e3a\u0e3f\u0e47-\u0e4f\u0e5a\u0e5b\u0eb1\u0eb4-\u0eb9\u0ebb\u0ebc"
    r"\u0ec8-\u0ecd\u0f01-\u0f1f\u0f34-\u0f3f\u0f71-\u0f87\u0f8d-\u0f97\u0f99-\u0fbc"
    r"\u0fbe-\u0fcc\u0fce-\u0fda\u102b-\u103e\u104a-\u104f\u1056-\u1059\u105e-\u1060"
    r"\u1062-\u1064\u1067-\u106d\u1071-\u1074\u1082-\u108d\u108f\u109a-\u109f\u10fb"
    r"\u135d-\u1368\u1390-\u1399\u1400\u166d\u166e\u1680\u169b\u169c\u16eb-\u16ed\u1712-\u1714"
    r"\u1732-\u1736\u1752\u1753\u1772\u1773\u17b4-\u17d6\u17d8-\u17db\u17dd\u1800-\u180e\u18a9"
    r"\u1920-\u192b\u1930-\u193b\u1940\u1944\u1945\u19b0-\u19c0\u19c8\u19c9\u19de-\u19ff"
    r"\u1a17-\u1a1b\u1a1e\u1a1f\u1a55-\u1a5e\u1a60-\u1a7c\u1a7f\u1aa0-\u1aa6\u1aa8-\u1aad"
    r"\u1b00-\u1b04\u1b34-\u1b44\u1b5a-\u1b7c\u1b80-\u1b82\u1ba1-\u1bad\u1be6-\u1bf3"
    r"\u1bfc-\u1bff\u1c24-\u1c37\u1c3b-\u1c3f\u1c7e\u1c7f\u1cc0-\u1cc7\u1cd0-\u1ce8\u1ced"
    r"\u1cf2-\u1cf4\u1dc0-\u1de6\u1dfc-\u1dff\u1fbd\u1fbf-\u1fc1\u1fcd-\u1fcf\u1fdd-\u1fdf"
    r"\u1fed-\u1fef\u1ffd\u1ffe\u2000-\u2064\u206a-\u206f\u207a-\u207e\u208a-\u208e"
    r"\u20a0-\u20b9\u20d0-\u20f0\u2100\u2101\u2103-\u2106\u2108\u2109\u2114\u2116-\u2118"
    r"\u211e-\u2123\u2125\u2127\u2129\u212e\u213a\u213b\u2140-\u2144\u214a-\u214d\u214f"
    r"\u2190-\u23f3\u2400-\u2426\u2440-\u244a\u249c-\u24e9\u2500-\u26ff\u2701-\u2775"
    r"\u2794-\u2b4c\u2b50-\u2b59\u2ce5-\u2cea\u2cef-\u2cf1\u2cf9-\u2cfc\u2cfe\u2cff\u2d70"
    r"\u2d7f\u2de0-\u2e2e\u2e30-\u2e3b\u2e80-\u2e99\u2e9b-\u2ef3\u2f00-\u2fd5\u2ff0-\u2ffb"
    r"\u3000-\u3004\u3008-\u3020\u302a-\u3030\u3036\u3037\u303d-\u303f\u3099-\u309c\u30a0"
    r"\u30fb\u3190\u3191\u3196-\u319f\u31c0-\u31e3\u3200-\u321e\u322a-\u3247\u3250"
    r"\u3260-\u327f\u328a-\u32b0\u32c0-\u32fe\u3300-\u33ff\u4dc0-\u4dff\ua490-\ua4c6\ua4fe"
    r"\ua4ff\ua60d-\ua60f\ua66f-\ua67e\ua69f\ua6f0-\ua6f7\ua700-\ua716\ua720\ua721\ua789\ua78a"
    r"\ua802\ua806\ua80b\ua823-\ua82b\ua836-\ua839\ua874-\ua877\ua880\ua881\ua8b4-\ua8c4\ua8ce"
    r"\ua8cf\ua8e0-\ua8f1\ua8f8-\ua8fa\ua926-\ua92f\ua947-\ua953\ua95f\ua980-\ua983"
    r"\ua9b3-\ua9cd\ua9de\ua9df\uaa29-\uaa36\uaa43\uaa4c\uaa4d\uaa5c-\uaa5f\uaa77-\uaa79\uaa7b"
    r"\uaab0\uaab2-\uaab4\uaab7\uaab8\uaabe\uaabf\uaac1\uaade\uaadf\uaaeb-\uaaf1\uaaf5\uaaf6"
    r"\uabe3-\uabed\ue000\ue001\ufb1e\ufb29\ufbb2-\ufbc1\ufd3e\ufd3f\ufdfc\ufdfd\ufe00-\ufe19"
    r"\ufe20-\ufe26\ufe30-\ufe52\ufe54-\ufe66\ufe68-\ufe6b\ufeff\uff01-\uff0f\uff1a-\uff20"
    r"\uff3b-\uff40\uff5b-\uff65\uffe0-\uffe6\uffe8-\uffee\ufff9-\uffff\U00010100-\U00010102"
    r"\U00010137-\U0001013f\U00010179-\U00010189\U00010190-\U0001019b\U000101d0-\U000101fd"
    r"\U0001039f\U000103d0\U00010857\U0001091f\U0001093f\U00010a01-\U00010a03\U00010a05"
    r"\U00010a06\U00010a0c-\U00010a0f\U00010a38-\U00010a3a\U00010a3f\U00010a50-\U00010a58"
    r"\U00010a7f\U00010b39-\U00010b3f\U00011000-\U00011002\U00011038-\U0001104d"
    r"\U00011080-\U00011082\U000110b0-\U000110c1\U00011100-\U00011102\U00011127-\U00011134"
    r"\U00011140-\U00011143\U00011180-\U00011182\U000111b3-\U000111c0\U000111c5-\U000111c8"
    r"\U000116ab-\U000116b7\U00012470-\U00012473\U00016f51-\U00016f7e\U00016f8f-\U00016f92"
    r"\U0001d000-\U0001d0f5\U0001d100-\U0001d126\U0001d129-\U0001d1dd\U0001d200-\U0001d245"
    r"\U0001d300-\U0001d356\U0001d6c1\U0001d6db\U0001d6fb\U0001d715\U0001d735\U0001d74f"
    r"\U0001d76f\U0001d789\U0001d7a9\U0001d7c3\U0001eef0\U0001eef1\U0001f000-\U0001f02b"
    r"\U0001f030-\U0001f093\U0001f0a0-\U0001f0ae\U0001f0b1-\U0001f0be\U0001f0c1-\U0001f0cf"
    r"\U0001f0d1-\U0001f0df\U0001f110-\U0001f12e\U0001f130-\U0001f16b\U0001f170-\U0001f19a"
    r"\U0001f1e6-\U0001f202\U0001f210-\U0001f23a\U0001f240-\U0001f248\U0001f250\U0001f251"
    r"\U0001f300-\U0001f320\U0001f330-\U0001f335\U0001f337-\U0001f37c\U0001f380-\U0001f393"
    r"\U0001f3a0-\U0001f3c4\U0001f3c6-\U0001f3ca\U0001f3e0-\U0001f3f0\U0001f400-\U0001f43e"
    r"\U0001f440\U0001f442-\U0001f4f7\U0001f4f9-\U0001f4fc\U0001f500-\U0001f53d"
    r"\U0001f540-\U0001f543\U0001f550-\U0001f567\U0001f5fb-\U0001f640\U0001f645-\U0001f64f"
    r"\U0001f680-\U0001f6c5\U0001f700-\U0001f773\U000e0001\U000e0020-\U000e007f"
    r"\U000e0100-\U000e01ef"
)
#: The combining marks unicode61 drops inside a word (``remove_diacritics 1``).
MARKS = r"\u0300-\u0304\u0306-\u030c\u030f\u0311\u031b\u0323-\u0328\u032d\u032e\u0330\u0331"
#: Letters unicode61 folds further than lower case does (micro sign, long s, final sigma,
#: Greek symbol forms, long s with dot above, prosgegrammeni) and what they become.
FOLD_FROM = r"\00b5\017f\03c2\03d0\03d1\03d5\03d6\03f0\03f1\03f5\1e9b\1fbe"
FOLD_TO = r"\03bcs\03c3\03b2\03b8\03c6\03c0\03ba\03c1\03b5s\03b9"
#: Characters only the slow branch handles: Latin letters that may carry a foldable
#: diacritic (only text holding one pays for the NFD/NFC round trip) and FOLD_FROM's.
SLOW = r"\u00b5\u00c0-\u024f\u03c2\u03d0\u03d1\u03d5\u03d6\u03f0\u03f1\u03f5\u1e00-\u1eff\u1fbe"
#: Collations whose lower() folds every script, best first; else the database's default.
COLLATIONS = ("und-x-icu", "C.utf8", "C.UTF-8", "en_US.utf8", "en_US.UTF-8")

#: One expression (no FROM, not STRICT) so PostgreSQL inlines it where it is called:
#: as a function call per row it cost the generated column twice as much.
WORDS_UTF8 = r"""CREATE FUNCTION @schema@.hermes_store_search_words(value text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
SELECT btrim(regexp_replace(regexp_replace(
    CASE WHEN lower(value@collate@) ~ '[{slow}]'
         THEN normalize(regexp_replace(
                  normalize(translate(lower(value@collate@), U&'{fold_from}', U&'{fold_to}'), NFD),
                  '([a-z])[{marks}](?![{marks}])', '\1', 'g'), NFC)
         ELSE lower(value@collate@) END,
    '[{marks}]', '', 'g'), '[{separators}]+', ' ', 'g'), ' ')
$fn$""".format(slow=SLOW, fold_from=FOLD_FROM, fold_to=FOLD_TO, marks=MARKS, separators="".join(SEPARATORS))

#: Without UTF8 there is no Unicode normalization: lower case and runs of [[:alnum:]].
WORDS_OTHER = r"""CREATE FUNCTION @schema@.hermes_store_search_words(value text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
SELECT btrim(regexp_replace(lower(value@collate@), '[^[:alnum:]]+', ' ', 'g'), ' ')
$fn$"""

VECTOR = r"""CREATE FUNCTION @schema@.hermes_store_search_vector(value text) RETURNS tsvector
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
SELECT COALESCE(string_agg('''' || w || ''':' || (n + 1), ' '), '')::tsvector
FROM unnest(string_to_array(@schema@.hermes_store_search_words(value), ' ')) WITH ORDINALITY AS t(w, n)
WHERE octet_length(w) < 2047
$fn$"""

#: The server picks the encoding's variant, the collation and the schema itself, so
#: ``alembic upgrade --sql`` writes a script that decides where it runs. Function
#: bodies name each other with the schema: neither a dump/restore nor a caller's own
#: search_path can make the generated column miss them.
CREATE_FUNCTIONS = """DO $do$
DECLARE
    preferred TEXT[] := ARRAY[{collations}];
    target TEXT := quote_ident(current_schema());
    coll_clause TEXT := COALESCE((
        SELECT ' COLLATE pg_catalog.' || quote_ident(collname) FROM pg_collation
        WHERE collnamespace = 'pg_catalog'::regnamespace AND collname = ANY (preferred)
          AND collencoding IN (-1, pg_char_to_encoding(current_setting('server_encoding')))
        ORDER BY array_position(preferred, collname::text) LIMIT 1), '');
BEGIN
    IF current_setting('server_encoding') = 'UTF8' THEN
        EXECUTE replace(replace($words${utf8}$words$, '@schema@', target), '@collate@', coll_clause);
    ELSE
        EXECUTE replace(replace($words${other}$words$, '@schema@', target), '@collate@', coll_clause);
    END IF;
    EXECUTE replace($vector${vector}$vector$, '@schema@', target);
END
$do$""".format(collations=", ".join(f"'{c}'" for c in COLLATIONS), utf8=WORDS_UTF8, other=WORDS_OTHER,
               vector=VECTOR)

NEW_COLUMN = """ALTER TABLE messages ADD COLUMN search_vector TSVECTOR GENERATED ALWAYS AS (
    hermes_store_search_vector(left(content, CASE WHEN role = 'tool' THEN 8192 ELSE 65536 END))
    || hermes_store_search_vector(left(tool_name, 4096))
    || hermes_store_search_vector(left(tool_calls, 32768))
) STORED"""

#: hs0002's column, exactly.
OLD_COLUMN = """ALTER TABLE messages ADD COLUMN search_vector TSVECTOR GENERATED ALWAYS AS (
        to_tsvector('simple'::regconfig, left(COALESCE(content, ''),
                                              CASE WHEN role = 'tool' THEN 8192 ELSE 65536 END))
        || to_tsvector('simple'::regconfig, left(COALESCE(tool_name, ''), 4096))
        || to_tsvector('simple'::regconfig, left(COALESCE(tool_calls, ''), 32768))
    ) STORED"""

INDEX = "CREATE INDEX idx_messages_search_vector ON messages USING gin (search_vector)"

MARK_DIRTY = r"""CREATE OR REPLACE FUNCTION hermes_store_cjk_bigram_mark_dirty() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    mark TEXT := (SELECT value FROM state_meta WHERE key = 'hermes_store.cjk_bigram_high_water');
BEGIN
    IF NEW.id <= (CASE WHEN mark ~ '^[ \t\n\r]*[-+]?[0-9]{1,18}[ \t\n\r]*$' THEN CAST(mark AS BIGINT) ELSE -1 END) THEN
        INSERT INTO messages_cjk_bigram_dirty (block) VALUES (NEW.id / 64)
        ON CONFLICT (block) DO NOTHING;
    END IF;
    RETURN NULL;
END
$$"""

#: hs0002's trigger function, exactly.
OLD_MARK_DIRTY = """CREATE OR REPLACE FUNCTION hermes_store_cjk_bigram_mark_dirty() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.id <= COALESCE((SELECT CAST(value AS BIGINT) FROM state_meta
                           WHERE key = 'hermes_store.cjk_bigram_high_water'), -1) THEN
        INSERT INTO messages_cjk_bigram_dirty (block) VALUES (NEW.id / 64)
        ON CONFLICT (block) DO NOTHING;
    END IF;
    RETURN NULL;
END
$$"""


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return  # SQLite's word index is Hermes' FTS5 table, tokenized by unicode61 itself
    op.execute(CREATE_FUNCTIONS)
    op.execute("DROP INDEX idx_messages_search_vector")
    op.execute("ALTER TABLE messages DROP COLUMN search_vector")
    op.execute(NEW_COLUMN)
    op.execute(INDEX)
    op.execute(MARK_DIRTY)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(OLD_MARK_DIRTY)
    op.execute("DROP INDEX idx_messages_search_vector")
    op.execute("ALTER TABLE messages DROP COLUMN search_vector")
    op.execute(OLD_COLUMN)
    op.execute(INDEX)
    op.execute("DROP FUNCTION hermes_store_search_vector(text)")
    op.execute("DROP FUNCTION hermes_store_search_words(text)")
