"""The --study file of an exploration, checked before optuna opens it: a SQLite file must be new
or a graphswap study (optuna's tables and their indexes, graphswap's study, no trigger or view:
`check_study_file`, read-only), an optuna storage URL must name a database `study_storage`
knows, its password never shown."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from urllib.parse import quote as urllib_quote

from graphswap.errors import GraphswapError

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
                schema = list(connection.execute(
                    "SELECT type, name, tbl_name FROM sqlite_master"))
                tables = {name for kind, name, _ in schema
                          if kind == "table" and not name.startswith("sqlite_")}
                studies = ({row[0] for row in connection.execute(
                    "SELECT study_name FROM studies")} if "studies" in tables else set())
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
    # an optuna database with no study at all is one another worker is creating now
    if studies and STUDY_NAME not in studies:
        shown = ", ".join(sorted(map(str, studies))[:6]) or "none"
        raise GraphswapError(
            f"the study {text} is an optuna database without graphswap's study "
            f"{STUDY_NAME!r} (its studies: {shown}); graphswap would add its study to it. "
            f"{new_file.capitalize()}")


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
