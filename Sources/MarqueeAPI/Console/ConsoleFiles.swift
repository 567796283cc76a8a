/// The operator console's files, one string each (`ConsoleFiles+*.swift`), served by `ConsoleRoutes`. Edit them in
/// place: each string is the file exactly as the browser gets it (no build step, no minifier, no package manager).
enum ConsoleFiles {}
