import Testing

@testable import HTTP2

/// A CONNECT proxy's answer: only HTTP/1.x 200 opens the tunnel, and what else it says is shown safely.
@Suite struct ConnectAnswerTests {
    private func answer(_ text: String) -> ConnectAnswer { ConnectAnswer(Array(text.utf8)) }

    @Test func onlyAnHTTP1200OpensTheTunnel() {
        #expect(answer("HTTP/1.1 200 Connection established\r\nProxy-Agent: tinyproxy\r\n\r\n") == .tunnel)
        #expect(answer("HTTP/1.0 200\r\n\r\n") == .tunnel)
        #expect(
            answer("HTTP/1.1 407 Proxy Authentication Required\r\n\r\n")
                == .wantsCredentials("HTTP/1.1 407 Proxy Authentication Required"))
        #expect(answer("HTTP/1.1 403 Forbidden\r\n\r\n") == .refused("HTTP/1.1 403 Forbidden"))
        #expect(answer("HTTP/2 200\r\n\r\n") == .refused("HTTP/2 200"))
        #expect(answer("SSH-2.0-OpenSSH\r\n\r\n") == .refused("SSH-2.0-OpenSSH"))
        #expect(answer("HTTP/1.1 2000 OK\r\n\r\n") == .refused("HTTP/1.1 2000 OK"))
        #expect(answer("") == .refused(""))
    }

    /// The status line reaches an operator's log: control characters (a terminal escape) are replaced, and the line
    /// is cut at 120 characters.
    @Test func whatAProxySaysIsShownWithoutControlCharactersAndBounded() {
        #expect(answer("HTTP/1.1 502 \u{1b}[2J\u{7}gone\r\n\r\n") == .refused("HTTP/1.1 502 ?[2J?gone"))
        guard case .refused(let shown) = answer("HTTP/1.1 502 " + String(repeating: "x", count: 10_000) + "\r\n\r\n")
        else {
            Issue.record("a long refusal was not a refusal")
            return
        }
        #expect(shown.count == 120)
    }

    @Test func theAnswerEndsAtTheBlankLineThatEndsItsHeaders() {
        #expect(!ConnectAnswer.isComplete(Array("HTTP/1.1 200 OK\r\n".utf8)))
        #expect(!ConnectAnswer.isComplete(Array("\r\n\r".utf8)))
        #expect(ConnectAnswer.isComplete(Array("HTTP/1.1 200 OK\r\n\r\n".utf8)))
    }
}
