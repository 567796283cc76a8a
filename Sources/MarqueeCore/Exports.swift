// JSON documents (`JSONValue`) are MarqueeCore's vocabulary: every module that speaks the domain speaks them too.
@_exported import JSON
