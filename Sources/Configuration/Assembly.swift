import AMQPBroker
import APNsSender
import Redis
import RedisStore
import Telemetry
import WorkerPipeline

extension WorkerConfiguration {
    /// The worker as `apns-worker run` runs it: the pipeline over RabbitMQ (`AMQPJobBroker`) and Redis
    /// (`RedisStores`), one session of both per connection. Reads the credential, and logs what deserves it about
    /// the key file.
    public func makeWorker(logger: Logger) throws(ConfigurationError) -> Worker {
        let authentication = try credential.makeAuthentication()
        if let problem = credential.privateKeyPermissionProblem() {
            logger.critical("the APNs private key is not private", ["file.problem": problem])
        }
        if let choice = credential.choice { logger.warning("two APNs credentials", ["apns.credentials": choice]) }
        let broker = self.broker, redis = self.redis, rateLimit = self.rateLimit
        let urgentShare = rateLimitUrgentShare
        let sender = APNsNotificationSender(configuration: apns, authentication: authentication,
                                            logger: logger.child("apns-client"))
        return Worker(settings: pipeline, sender: sender, logger: logger) {
            let amqp = try AMQPJobBroker(settings: broker, logger: logger)
            do {
                let stores = try RedisStores(redis, rateLimit: rateLimit, urgentShare: urgentShare,
                                             logger: logger)
                return WorkerSession(broker: amqp, tokens: stores.tokens,
                                     preparationTokens: try RedisStores.tokenCache(redis, logger: logger),
                                     record: stores.record,
                                     statistics: stores.statistics, rateLimiter: stores.rateLimiter,
                                     invalidationWindow: stores.invalidationWindow,
                                     store: RedisProbe(stores.connection),
                                     logMetadata: amqp.logMetadata.merging(["redis.url": redis.description]) { $1 })
            } catch {
                amqp.close()
                throw error
            }
        }
    }
}
