import APNs
import Foundation
import JSON
import Testing
import WorkerPipeline

@Suite struct DeadTokenEventTests {
    @Test func encodesTheContractShape() throws {
        let event = DeadTokenEvent(
            token: "abcd", user: "u1", topic: "com.example.app", environment: .production,
            status: 410, reason: "Unregistered", timestamp: 1_732_900_000_000, jobID: "job-42")
        let object = try JSONSerialization.jsonObject(with: Data(event.json)) as! [String: Any]
        #expect(object["token"] as? String == "abcd")
        #expect(object["user"] as? String == "u1")
        #expect(object["topic"] as? String == "com.example.app")
        #expect(object["environment"] as? String == "production")
        #expect((object["status"] as? NSNumber)?.intValue == 410)
        #expect(object["reason"] as? String == "Unregistered")
        #expect((object["timestamp"] as? NSNumber)?.int64Value == 1_732_900_000_000)
        #expect(object["job_id"] as? String == "job-42")

        let direct = DeadTokenEvent(
            token: "ab", user: nil, topic: "t", environment: .sandbox, status: 400,
            reason: "BadDeviceToken", timestamp: nil, jobID: "j\"1")
        let decoded = try JSONSerialization.jsonObject(with: Data(direct.json)) as! [String: Any]
        #expect(decoded["user"] is NSNull)
        #expect(decoded["timestamp"] is NSNull)
        #expect(decoded["job_id"] as? String == "j\"1")
    }
}
