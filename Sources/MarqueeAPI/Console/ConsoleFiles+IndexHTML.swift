// The console's `index.html`, exactly as the browser gets it (ConsoleRoutes says why it is embedded in the binary).

extension ConsoleFiles {
    /// `index.html`: the page at `/console`: the shell the modules fill.
    static let indexHTML = #"""
        <!doctype html>
        <html lang="en">
        <head>
        <meta charset="utf-8">
        <meta name="viewport" content="width=device-width, initial-scale=1">
        <meta name="color-scheme" content="light dark">
        <meta name="referrer" content="no-referrer">
        <title>Marquee console</title>
        <link rel="icon" href="/console/favicon.svg" type="image/svg+xml">
        <link rel="stylesheet" href="/console/console.css">
        <script type="module" src="/console/app.js"></script>
        </head>
        <body>
        <a class="skip-link" id="skip-link" href="#main">Skip to content</a>
        <header class="top-bar">
          <span class="brand"><img src="/console/favicon.svg" alt="" width="20" height="20"> Marquee</span>
          <nav id="nav" aria-label="Console sections" hidden>
            <a href="#/overview" data-section="overview">Overview</a>
            <a href="#/activities" data-section="activities">Live activities</a>
            <a href="#/campaigns" data-section="campaigns">Campaigns</a>
            <a href="#/failures" data-section="failures">Failures</a>
          </nav>
          <span class="top-spacer"></span>
          <span id="key-hint" class="key-hint" hidden></span>
          <button id="sign-out" class="button secondary" type="button" hidden>Sign out</button>
        </header>
        <main id="main" tabindex="-1">
          <noscript><p class="notice">The Marquee console needs JavaScript (modules) enabled.</p></noscript>
        </main>
        <div id="announcer" class="visually-hidden" aria-live="polite" aria-atomic="true"></div>
        </body>
        </html>
        """#
}
