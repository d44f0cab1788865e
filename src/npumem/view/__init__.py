"""`npumem view`: a local server over memory recordings of any size, for the browser page in
static/. sources (reading every input kind), series and levels (the totals precomputed once),
source (one opened input and its axis), aggregate (the timeline at any zoom), moment (what is
live at a time; one allocation), whatif and jobs (tune's settings replayed in the background),
panels and host (leaks, steps, msprof's totals, pinned host memory), settings (what the what-if
picker offers), api (the routes), errors, and server (HTTP, token, static files). API.md is the
contract with the page."""
