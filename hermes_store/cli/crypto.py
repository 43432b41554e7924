"""``hermes-store encrypt`` / ``decrypt`` / ``rekey``: an encrypted SQLite store (SQLCipher).

The work is :func:`hermes_store.adopt.recrypt.recrypt`'s: a verified export into a new
file, swapped in with one rename; a kill at any step leaves the original readable.
Keys never come on the command line (other users see it in the process list): from
``$HERMES_STORE_KEY``, a file named by ``$HERMES_STORE_KEY_FILE`` or ``--key-file``
(0600), and for ``rekey`` the new one from ``--new-key-file``.
"""

from __future__ import annotations

from pathlib import Path

import click
from rich.text import Text

from .. import adopt as adopt_mod
from .. import encryption
from ..adopt.recrypt import Recrypted, recrypt
from ._common import PROG, CliError, State, _state, global_options, require_file, stdout_console

#: What a user choosing encryption must know (also in README).
HERMES_CANNOT_OPEN = ("Hermes itself cannot open an encrypted file: only hermes_store (SessionDB(path, key=...), "
                      f"the {PROG} commands with its key) can. Keep the key safe: without it the data is lost.")

KEY_FILE = click.Path(dir_okay=False, path_type=Path)


def _key(key_file: Path | None, what: str) -> encryption.StoreKey:
    """The key from ``--key-file``, else the environment; refused when there is none."""
    found = encryption.read_key_file(key_file) if key_file is not None else encryption.resolve()
    if found is None:
        raise CliError(f"{what}: give the key in a 0600 file (--key-file FILE) or ${encryption.KEY_ENV} / "
                       f"${encryption.KEY_FILE_ENV}", code="encryption_key")
    return found


def _file(st: State) -> Path:
    if st.url is not None:
        raise CliError("encryption is for SQLite files (--db PATH); a server's encryption at rest is the "
                       "server's (its disk or provider)", code="needs_file")
    path = st.file
    require_file(path)
    if path.stat().st_size == 0:
        raise CliError(f"{path} is empty: create the store with its key instead "
                       f"({PROG} --db {path} upgrade, with ${encryption.KEY_ENV} set)", code="empty_database")
    return path


def _report(st: State, done: Recrypted, verb: str, note: str | None) -> None:
    doc = {**done.as_dict(), "action": verb, "note": note}
    if st.json:
        st.emit(doc)
        return
    out = stdout_console()
    rows = sum(done.tables.values())
    out.print(Text(f"{verb.capitalize()} {done.path}: {len(done.tables)} tables, {rows} rows and "
                   f"{len(done.fts_indexes)} full-text indexes checked against the original before the swap."))
    if note:
        out.print(Text(note))


@click.command()
@click.option("--key-file", type=KEY_FILE, metavar="FILE",
              help="The new key (passphrase, or x'<64 hex>'), in a file only you can read (0600). "
                   "Default: $HERMES_STORE_KEY, then the file $HERMES_STORE_KEY_FILE names.")
@global_options
def encrypt(key_file: Path | None) -> None:
    """Encrypt a plain store file with SQLCipher (Hermes itself cannot open the result).

    The whole file is exported into a new encrypted file, checked row by row
    against the original and swapped in with one rename; no plain copy is kept.
    A Hermes-made state.db is adopted first, by 'adopt', never by this command.
    """
    st = _state()
    path = _file(st)
    key = _key(key_file, "encrypt needs the new key")
    if adopt_mod.needs_adoption(path):
        raise CliError(f"{path} was written by Hermes and is not adopted yet: run '{PROG} --db {path} adopt' "
                       "first (explicitly: Hermes cannot open the encrypted result)", code="needs_adoption")
    _report(st, recrypt(path, None, key), "encrypted", HERMES_CANNOT_OPEN)


@click.command()
@click.option("--key-file", type=KEY_FILE, metavar="FILE",
              help="The current key, in a 0600 file. Default: $HERMES_STORE_KEY / $HERMES_STORE_KEY_FILE.")
@global_options
def decrypt(key_file: Path | None) -> None:
    """Turn an encrypted store file back into a plain SQLite file.

    Exported, checked against the original and swapped in with one rename, as
    'encrypt' does. Afterwards open it without a key.
    """
    st = _state()
    path = _file(st)
    key = _key(key_file, "decrypt needs the current key")
    _report(st, recrypt(path, key, None), "decrypted",
            f"{path} is a plain SQLite file now: unset ${encryption.KEY_ENV} / ${encryption.KEY_FILE_ENV} to open it.")


@click.command()
@click.option("--key-file", type=KEY_FILE, metavar="FILE",
              help="The current key, in a 0600 file. Default: $HERMES_STORE_KEY / $HERMES_STORE_KEY_FILE.")
@click.option("--new-key-file", type=KEY_FILE, metavar="FILE", required=True,
              help="The new key, in a 0600 file.")
@global_options
def rekey(key_file: Path | None, new_key_file: Path) -> None:
    """Change an encrypted store's key (a new file, checked, swapped in).

    Exported under the new key, checked against the original and swapped in with
    one rename; a kill at any step leaves the file readable with the old key or,
    once swapped, the new one.
    """
    st = _state()
    path = _file(st)
    old = _key(key_file, "rekey needs the current key")
    new = encryption.read_key_file(new_key_file)
    if new == old:
        raise CliError("the new key is the current one; nothing to do", code="same_key")
    _report(st, recrypt(path, old, new), "re-keyed", "Open it with the new key from now on.")


COMMANDS = (encrypt, decrypt, rekey)
