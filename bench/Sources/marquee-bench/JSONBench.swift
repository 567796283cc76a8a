import Foundation
import MarqueeCore

/// `marquee-bench json --n 200000`: JSONValue's parse and write on the documents a push is made of (a campaign
/// instance's attributes, content state and options as the worker reads them from its claim, an APNs start payload
/// as the simulator reads it, and one with non-ASCII text and numbers), nanoseconds a document, best of 3 rounds.
func jsonBench(_ arguments: [String]) throws {
    let n = option("--n", arguments, default: 200_000)
    let documents = [
        #"{"match":"A-B","team":"Team 3"}"#,
        #"{"home":0,"away":0}"#,
        #"{"alert":{"title":"Kick-off","body":"A v B"}}"#,
        #"{"aps":{"timestamp":1764945600,"event":"start","content-state":{"home":0,"away":0,"_marquee":{"d":"01M933EVV4PN5ZCMTCBSH8VZ18","i":"cup.p12345"}},"attributes-type":"MatchAttributes","attributes":{"match":"A-B","team":"Team 3","instance_id":"cup.p12345"},"input-push-token":1,"alert":{"title":"Kick-off","body":"A v B","sound":"default"}}}"#,
        #"{"name":"Zoë Ångström","city":"Zürich","tags":["a","b","c"],"n":-12345678901,"f":1.5}"#,
    ].map { Array($0.utf8) }
    let values = try documents.map { try JSONValue.parse($0) }
    var parse = Double.infinity
    var write = Double.infinity
    var sink = 0
    for _ in 0..<3 {
        var start = DispatchTime.now().uptimeNanoseconds
        for _ in 0..<n {
            for document in documents { sink &+= try JSONValue.parse(document).objectValue?.count ?? 0 }
        }
        parse = min(parse, Double(DispatchTime.now().uptimeNanoseconds - start) / Double(n * documents.count))
        start = DispatchTime.now().uptimeNanoseconds
        for _ in 0..<n {
            for value in values { sink &+= value.bytes.count }
        }
        write = min(write, Double(DispatchTime.now().uptimeNanoseconds - start) / Double(n * values.count))
    }
    print(
        #"{"bench":"json","documents":\#(documents.count),"n":\#(n),"parse_ns":\#(Int(parse)),"#
            + #""write_ns":\#(Int(write)),"checksum":\#(sink)}"#)
}
