import Testing
import WorkerPipeline

@Suite struct DeliveryTriageTests {
    let triage = DeliveryTriage(maximumDeliveries: 5)

    func delivery(
        _ tag: UInt64, body: String = "{}", messageID: String? = nil, redelivered: Bool = false,
        brokerCount: Int? = nil
    ) -> JobDelivery {
        JobDelivery(
            tag: tag, redelivered: redelivered, body: Array(body.utf8),
            properties: MessageProperties(messageID: messageID, deliveryCount: brokerCount))
    }

    @Test func aJobsHistoryIsKeptUnderItsMessageIDOrItsBody() {
        #expect(DeliveryTriage.historyKey(delivery(1, messageID: "m-1")) == "id:m-1")
        #expect(DeliveryTriage.historyKey(delivery(1, body: "a")) == "body:af63dc4c8601ec8c", "FNV-1a 64 of \"a\"")
        #expect(
            DeliveryTriage.historyKey(delivery(1, body: "a")) == DeliveryTriage.historyKey(delivery(2, body: "a")),
            "the same body gives the same key whatever the delivery")
        #expect(DeliveryTriage.historyKey(delivery(1, body: "a")) != DeliveryTriage.historyKey(delivery(1, body: "b")))
        // An empty message-id is none: unrelated jobs carrying one would share a history, and be parked together.
        #expect(
            DeliveryTriage.historyKey(delivery(1, body: "a", messageID: ""))
                != DeliveryTriage.historyKey(delivery(2, body: "b", messageID: "")))
    }

    @Test func firstDeliveriesCostNothingAndTheBrokersCountIsUsedWhereItCounts() {
        let (counts, uncounted) = triage.brokerCounts(of: [
            delivery(1), delivery(2, redelivered: true, brokerCount: 3), delivery(3, messageID: "m", redelivered: true)
        ])
        #expect(counts == [2: 4], "the broker's count is of deliveries before this one")
        #expect(uncounted.map(\.tag) == [3] && uncounted.map(\.key) == ["id:m"])
        let merged = triage.merging(counts, uncounted: uncounted, storeRedeliveries: ["id:m": 2])
        #expect(merged == [2: 4, 3: 3], "the store counts redeliveries: two of them make the third delivery")
    }

    /// On a classic queue `x-delivery-count` is whatever the publisher wrote: the largest count is poison (kept
    /// beyond any WORKER_MAX_DELIVERIES, which is at most 1,000), with no overflow.
    @Test func theLargestDeliveryCountAPublisherCanWriteIsPoison() {
        let (counts, _) = triage.brokerCounts(of: [delivery(7, redelivered: true, brokerCount: .max)])
        #expect(counts.keys.sorted() == [7] && counts[7]! > 1_000, "\(counts)")
        let (negative, uncounted) = triage.brokerCounts(of: [
            delivery(8, redelivered: true, brokerCount: -3), delivery(9, redelivered: true, brokerCount: .min)
        ])
        #expect(negative.isEmpty && uncounted.map(\.tag) == [8, 9], "a negative count is none: the store counts")
    }

    @Test func sortsUsualJobsSuspectsAndPoison() {
        let batch = [
            delivery(1), delivery(2, messageID: "twice"), delivery(3, messageID: "thrice"),
            delivery(4, messageID: "over-and-died"), delivery(5, messageID: "thrice-lost"),
            delivery(6, messageID: "over-but-lost")
        ]
        let deliveries: [UInt64: Int] = [2: 2, 3: 3, 4: 6, 5: 3, 6: 6]
        #expect(
            triage.suspectCandidates(batch, deliveries: deliveries).sorted()
                == ["id:over-and-died", "id:over-but-lost", "id:thrice", "id:thrice-lost"])
        let sorted = triage.sort(
            batch, deliveries: deliveries, diedAlone: ["id:over-and-died"],
            ranAndDied: ["id:thrice", "id:twice"])
        #expect(
            sorted.usual.map(\.tag) == [1, 2, 5, 6],
            "one redelivery is a failover, not a suspect; nor are deliveries no worker died running (lost in transit)")
        #expect(sorted.suspects.map(\.tag) == [3], "a third delivery whose last run ended with its worker")
        #expect(sorted.poison.map(\.delivery.tag) == [4])
        #expect(sorted.poison.first?.deliveries == 6 && sorted.poison.first?.historyKey == "id:over-and-died")
    }

    @Test func aLowLimitMakesSuspectsSooner() {
        #expect(DeliveryTriage(maximumDeliveries: 1).suspectFrom == 2)
        #expect(DeliveryTriage(maximumDeliveries: 5).suspectFrom == 3)
    }

    @Test func thePoisonReasonSaysWhyWithoutNamingASetting() {
        let reason = triage.reason(.init(delivery: delivery(1), deliveries: 6, historyKey: "id:x"))
        #expect(reason.hasPrefix("delivered 6 times, more than the 5 allowed"))
        #expect(!reason.contains("WORKER_"))
    }

    @Test func deliveriesGivenBackInOrderlyStopsDoNotCount() {
        let batch = [
            delivery(1, messageID: "restarted", redelivered: true), delivery(2, messageID: "crashed", redelivered: true)
        ]
        let discounted = triage.discounting([1: 3, 2: 3], of: batch, givenBack: ["id:restarted": 2, "id:other": 5])
        #expect(discounted == [1: 1, 2: 3])
        #expect(
            triage.discounting([1: 2], of: batch, givenBack: ["id:restarted": 9]) == [1: 1], "the first delivery counts"
        )
    }
}
