import Foundation

/// How long to wait before reconnecting to the broker or Redis after `failures` failures in a row: doubling from
/// 0.25 s up to 30 s, jittered so that a fleet that lost its broker does not come back in step.
public func reconnectDelay(afterFailures failures: Int) -> Double {
    min(30, 0.25 * pow(2, Double(min(failures - 1, 7)))) * Double.random(in: 0.5...1)
}
