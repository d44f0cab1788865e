"""`npumem view`: open recordings in the browser (view/: the server, its API and its page)."""

from __future__ import annotations

import sys

import click


@click.command("view")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("--port", default=0, show_default=True, type=click.IntRange(0, 65535),
              help="Port to serve on (0: a free one).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind. Anything but 127.0.0.1 lets other machines reach it "
                   "(they still need the token).")
@click.option("--no-browser", is_flag=True, help="Do not open a browser; just print the address.")
@click.option("--device", type=click.IntRange(min=0), default=None,
              help="The device of a multi-device snapshot to show (default: the one that ran "
                   "out of memory, else the first with trace entries).")
def view(paths, port, host, no_browser, device):
    """Open a snapshot, profile folder, trace, msprof folder or estimate's predicted.pickle
    in the browser: the timeline at any zoom, what is live at a moment, each allocation,
    what-if replays of tune's settings, leaks and steps. With two PATHs, compares them on one
    time axis. Serves until Ctrl-C."""
    import os

    from ..file_paths import not_a_file
    from ..view.api import App, open_sources
    from ..view.server import ViewServer, new_token, serve_address
    from ..view.errors import SourceError
    from ..view.panels import analyze_later

    if len(paths) > 2:
        raise click.UsageError("give one path, or two to compare")
    for path in paths:
        if not (os.path.isfile(path) or os.path.isdir(path)):
            _fail(f"{path}: {not_a_file(path)}")
    token = new_token()
    try:       # the port first: a port in use is said before minutes of reading
        server = ViewServer((host, port), None, token)
    except OSError as exc:
        _fail(f"cannot serve on {host}:{port}: {exc.strerror or exc}")
    serving = False
    try:
        try:
            sources = open_sources(list(paths), device=device)
        except SourceError as exc:
            _fail(str(exc))
        except MemoryError:
            _fail("out of host memory (RAM) while reading the input")
        server.app = App(sources)
        for source in sources:
            analyze_later(source)
        address = serve_address(server)
        click.echo(f"serving {' and '.join(paths)} at {address}")
        sys.stdout.flush()
        if not no_browser:
            _open_browser(address)
        serving = True
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        if not serving:                  # the viewer never came up: not a normal end
            click.echo(f"stopped while reading {' and '.join(paths)}", err=True)
            sys.exit(130)
        click.echo("stopped")
    finally:
        server.server_close()


def _open_browser(address: str) -> None:
    """Open the page where a graphical browser can be: in a thread (a browser that takes its
    time does not hold the server back), and never a console browser (lynx, w3m), which
    would take over the terminal the server prints to; elsewhere the printed address is it."""
    import os
    import threading
    import webbrowser

    graphical = sys.platform in ("darwin", "win32") or any(
        os.environ.get(name) for name in ("DISPLAY", "WAYLAND_DISPLAY", "BROWSER"))
    if not graphical:
        click.echo("(no display here: open the address above in a browser)", err=True)
        return

    def open_page():
        try:
            webbrowser.open(address)
        except Exception:               # no browser after all: the address is printed
            pass

    threading.Thread(target=open_page, name="npumem-view-browser", daemon=True).start()


def _fail(message: str):
    from .errors import CommandError

    raise CommandError(message)
