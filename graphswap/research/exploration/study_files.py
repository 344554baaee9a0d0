"""The --study file of an exploration, checked before optuna opens it: a SQLite file must be new
or a graphswap study (optuna's tables and their indexes, each defined exactly as optuna defines
it - `reference_schema` -, graphswap's study, no trigger or view, no value nested deeper than
graphswap writes: `check_study_file`, read-only), an optuna storage URL must name a database
`study_storage` knows, its password never shown."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import tempfile
import threading
from urllib.parse import quote as urllib_quote

from graphswap.errors import GraphswapError
from graphswap.input_files import MAX_JSON_DEPTH, json_depth

#: the tables optuna's RDB storage creates (optuna 2.x - 4.x); a study file holds no others
OPTUNA_TABLES = frozenset({
    "alembic_version", "studies", "study_directions", "study_user_attributes",
    "study_system_attributes", "trials", "trial_params", "trial_values",
    "trial_intermediate_values", "trial_user_attributes", "trial_system_attributes",
    "trial_heartbeats", "version_info"})
STUDY_NAME = "graphswap-explore"


def check_study_file(path) -> None:
    """Refuse a --study file that is not a graphswap study, before optuna opens it (optuna adds
    its tables to any SQLite file): a missing or empty file is a new study; an existing one must be
    an SQLite database of optuna's tables and graphswap's study.  Reads only (and rolls back a hot
    journal, as SQLite's next read-write open would)."""
    text = os.fspath(path)
    new_file = "give --study a new file name (graphswap creates it)"
    if os.path.isdir(text):
        raise GraphswapError(f"the study {text} is a directory; {new_file}")
    if not os.path.exists(text) or os.path.getsize(text) == 0:
        return
    try:
        with open(text, "rb") as handle:
            magic = handle.read(16)
    except OSError as exc:
        raise GraphswapError(f"cannot read the study {text}: {exc.strerror or exc}") from None
    if magic != b"SQLite format 3\x00":
        raise GraphswapError(f"the study {text} is not an SQLite database (a graphswap study is "
                             f"one); {new_file}, or delete {text} if it is not needed")
    uri = "file:" + urllib_quote(os.path.abspath(text)) + "?mode="
    for mode in ("ro", "rw"):   # a hot journal (a killed writer's) rolls back only in "rw"
        try:
            with contextlib.closing(sqlite3.connect(uri + mode, uri=True)) as connection:
                definitions = list(connection.execute(
                    "SELECT type, name, tbl_name, sql FROM sqlite_master"))
                schema = [row[:3] for row in definitions]
                tables = {name for kind, name, _ in schema
                          if kind == "table" and not name.startswith("sqlite_")}
                studies = ({row[0] for row in connection.execute(
                    "SELECT study_name FROM studies")} if "studies" in tables else set())
                deepest = _deepest_value(connection, tables)
            break
        except sqlite3.Error as exc:
            if mode == "ro" and os.path.exists(text + "-journal"):
                continue
            raise GraphswapError(f"the study {text} cannot be read as an SQLite database "
                                 f"({exc}); {new_file}") from None
    # triggers and views run or answer when optuna reads and writes the study: never optuna's
    extra = sorted(f"{kind} {name}" for kind, name, table in schema if kind not in (
        "table", "index") or (kind == "index" and table not in OPTUNA_TABLES))
    if extra:
        shown = ", ".join(extra[:6]) + (", ..." if len(extra) > 6 else "")
        raise GraphswapError(
            f"the study {text} holds SQLite schema entries graphswap and optuna never write "
            f"({shown}): a trigger runs whenever the study is written (it could change or delete "
            f"what was measured) and a view answers in a table's place; a graphswap study holds "
            f"only optuna's tables and their indexes. {new_file.capitalize()}")
    foreign = sorted(tables - OPTUNA_TABLES)
    if foreign:
        shown = ", ".join(foreign[:6]) + (", ..." if len(foreign) > 6 else "")
        raise GraphswapError(
            f"the study {text} is an SQLite database with tables of its own ({shown}), not a "
            f"graphswap study; graphswap would add optuna's tables to it. {new_file.capitalize()}")
    # a table or index defined otherwise than optuna defines it: a constraint changed to ON
    # CONFLICT REPLACE (or a column's default or type) would let optuna's writes destroy results
    reference = reference_schema()
    changed = sorted(f"{kind} {name}" for kind, name, table, sql in definitions
                     if not name.startswith("sqlite_")
                     and reference.get((kind, name)) != (table, _normal(sql)))
    if changed:
        shown = ", ".join(changed[:6]) + (", ..." if len(changed) > 6 else "")
        raise GraphswapError(
            f"the study {text} defines {shown} otherwise than graphswap creates it (with optuna "
            f"{_optuna_version()}): a changed constraint (ON CONFLICT REPLACE, ...) or column "
            f"would let the next write replace or lose measured results. It was edited, or "
            f"written by another optuna version; {new_file}, or open it with the optuna that "
            f"wrote it")
    if deepest is not None:
        raise GraphswapError(
            f"the study {text} holds a value nested {deepest[1]:,} levels deep in its table "
            f"{deepest[0]}, more than the {MAX_JSON_DEPTH} graphswap reads (graphswap writes "
            f"numbers, names and small objects); it was edited. {new_file.capitalize()}")
    # an optuna database with no study at all is one another worker is creating now
    if studies and STUDY_NAME not in studies:
        shown = ", ".join(sorted(map(str, studies))[:6]) or "none"
        raise GraphswapError(
            f"the study {text} is an optuna database without graphswap's study "
            f"{STUDY_NAME!r} (its studies: {shown}); graphswap would add its study to it. "
            f"{new_file.capitalize()}")


#: the JSON columns of optuna's tables: values optuna parses when it reads the study
JSON_COLUMNS = (("study_user_attributes", "value_json"), ("study_system_attributes", "value_json"),
                ("trial_user_attributes", "value_json"), ("trial_system_attributes", "value_json"),
                ("trial_params", "distribution_json"))


def _deepest_value(connection, tables) -> tuple[str, int] | None:
    """(table, depth) of the first JSON value nested deeper than MAX_JSON_DEPTH, or None."""
    for table, column in JSON_COLUMNS:
        try:
            values = connection.execute(f"SELECT {column} FROM {table}") if table in tables \
                else ()
            for (value,) in values:
                depth = json_depth(value) if isinstance(value, (str, bytes)) else 0
                if depth > MAX_JSON_DEPTH:
                    return table, depth
        except sqlite3.Error:  # a table without the column: its definition is refused
            continue
    return None


def _normal(sql) -> str | None:
    return None if sql is None else " ".join(sql.split())


_reference: dict = {}
_reference_lock = threading.Lock()


def _optuna_version() -> str:
    import optuna

    return optuna.__version__


def reference_schema() -> dict:
    """{(type, name): (table, sql)} of the SQLite schema optuna creates for a study, with the
    optuna and SQLAlchemy installed: made once per process, in a temporary folder."""
    with _reference_lock:
        if not _reference:
            import optuna

            optuna.logging.set_verbosity(optuna.logging.WARNING)
            with tempfile.TemporaryDirectory(prefix="graphswap-study-") as folder:
                path = os.path.join(folder, "reference.db")
                storage = optuna.storages.RDBStorage(f"sqlite:///{path}")
                storage.engine.dispose()
                with contextlib.closing(sqlite3.connect(path)) as connection:
                    _reference.update({(kind, name): (table, _normal(sql)) for kind, name, table,
                                       sql in connection.execute(
                                           "SELECT type, name, tbl_name, sql FROM sqlite_master")})
        return dict(_reference)


def study_storage(study) -> tuple[str | None, str | None]:
    """(optuna storage URL, the name shown in messages) of a --study value: None (in memory), a
    SQLite file path, or an optuna RDB storage URL - sqlite:///PATH, postgresql://..., or
    mysql://... (a driver suffix such as postgresql+psycopg2:// is allowed).  A SQLite file is
    checked to be a graphswap study (or new) before optuna opens it; a URL's password is never
    shown."""
    if study is None:
        return None, None
    text = os.fspath(study)
    if "://" not in text:
        check_study_file(text)  # never add optuna's tables to a file that is not a study
        return f"sqlite:///{text}", text
    scheme = text.split("://", 1)[0]
    dialect = scheme.split("+", 1)[0].lower()
    if dialect not in STUDY_DIALECTS:
        raise GraphswapError(
            f"the study URL {_shown_url(text)} has the scheme {scheme!r}; allowed: a SQLite file "
            f"path, or an optuna storage URL sqlite:///PATH, postgresql://USER:PASSWORD@HOST/DB "
            f"or mysql://USER:PASSWORD@HOST/DB (a database server every worker reaches)")
    if scheme.lower() in ("postgresql", "postgres"):
        # SQLAlchemy's default driver differs between versions (psycopg2, then psycopg 3):
        # name the one installed
        driver = _installed(("psycopg", "psycopg2"))
        if driver is not None:
            text = f"postgresql+{driver}://" + text.split("://", 1)[1]
    elif scheme.lower() == "mysql" and _installed(("MySQLdb",)) is None and \
            _installed(("pymysql",)) is not None:
        text = "mysql+pymysql://" + text.split("://", 1)[1]
    if dialect == "sqlite":
        path = text[len(scheme) + 3:]
        if not path.startswith("/") or path in ("/", "/:memory:"):
            raise GraphswapError(f"the study URL {text} names no database file; write "
                                 f"sqlite:///relative/path.db or sqlite:////absolute/path.db")
        check_study_file(path[1:])
    return text, _shown_url(text)


STUDY_DIALECTS = ("sqlite", "postgresql", "postgres", "mysql")


def _installed(modules) -> str | None:
    """The first of `modules` that can be imported (found, not imported)."""
    import importlib.util

    for name in modules:
        if importlib.util.find_spec(name) is not None:
            return name
    return None


def _shown_url(url: str) -> str:
    """`url` with its password masked."""
    head, sep, rest = url.partition("://")
    if not sep or "@" not in rest.split("/", 1)[0]:
        return url
    credentials, _, host = rest.split("/", 1)[0].rpartition("@")
    user = credentials.split(":", 1)[0]
    tail = rest[len(rest.split("/", 1)[0]):]
    return f"{head}://{user}{':***' if ':' in credentials else ''}@{host}{tail}"
