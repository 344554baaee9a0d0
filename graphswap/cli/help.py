"""Short --help, full --help-all: a command's options in headed sections.

An option made with SectionOption belongs to a section (its heading in the help): the
quantization and calibration options, the data and task options, the model loading options, or
a command's less used ones ("More options").  SectionedCommand's --help shows the options of
the plain "Options" section and one line naming the other sections and how many options each
holds; --help-all shows every option, each section under its own heading.  A command without
sectioned options has no --help-all (its --help already shows everything).
"""

from __future__ import annotations

import click

OPTIONS = "Options"
QUANTIZATION = "Quantization and calibration options"
DATA = "Data and task options"
LOADING = "Model loading options"
MORE = "More options"
SECTION_ORDER = (OPTIONS, MORE, DATA, QUANTIZATION, LOADING)

#: ctx.meta key: set while --help-all writes the help
SHOW_ALL = "graphswap.help_all"


class SectionOption(click.Option):
    """A click option shown under `section`'s heading; only the "Options" section is shown by
    --help, every section by --help-all."""

    def __init__(self, *args, section: str = OPTIONS, **kwargs):
        super().__init__(*args, **kwargs)
        self.section = section


def section_of(param) -> str:
    return getattr(param, "section", OPTIONS)


def _show_all(ctx, param, value):
    if not value or ctx.resilient_parsing:
        return
    ctx.meta[SHOW_ALL] = True
    click.echo(ctx.get_help(), color=ctx.color)
    ctx.exit()


#: one option object shared by every sectioned command (as flask's cli shares its options)
HELP_ALL_OPTION = click.Option(
    ["--help-all"], is_flag=True, expose_value=False, is_eager=True, callback=_show_all,
    help="Show every option, each group under its heading, and exit.")


class SectionedCommand(click.Command):
    """A click command whose --help shows its essential options and --help-all every option,
    grouped under the headings of their sections."""

    def hides_options(self) -> bool:
        return any(section_of(param) != OPTIONS for param in self.params)

    def get_params(self, ctx):
        params = super().get_params(ctx)
        if self.hides_options():   # --help-all just before --help, which click puts last
            count = len(self.params)
            params = [*params[:count], HELP_ALL_OPTION, *params[count:]]
        return params

    def format_options(self, ctx, formatter):
        show_all = ctx.meta.get(SHOW_ALL, False)
        sections = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None and not isinstance(param, click.Argument):
                sections.setdefault(section_of(param), []).append(record)
        hidden = []
        for title in sorted(sections, key=SECTION_ORDER.index):
            if title == OPTIONS or show_all:
                with formatter.section(title):
                    formatter.write_dl(sections[title])
            else:
                hidden.append(f"{len(sections[title])} {title.lower()}")
        if hidden:
            formatter.write_paragraph()
            formatter.write_text(f"Also {', '.join(hidden)}: --help-all shows every option.")
